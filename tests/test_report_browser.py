"""The HTML report in a real headless Chromium, and the PDF report through poppler.

Needs the Debian packages ``chromium`` and ``poppler-utils`` (``.ci/run`` installs them).
Checks structure a reader relies on: the headline and scenario, headers in words, a legend
on every figure, panels left out when they do not apply, hostile names inert; and the PDF as
a document: one page size (A4 or Letter), a table of contents, page numbers, several tables
on a page, no blank page.
"""

from __future__ import annotations

import dataclasses
import html as html_lib
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import SHARED, ingest_cached

from retime.analysis import build_report, kernel_stats, write_html, write_pdf
from retime.analysis.report_run import RunAnalysis
from retime.analysis.tables import fmt_ns

pytestmark = pytest.mark.browser

INJECT = ("<script>document.documentElement.setAttribute('data-pwned','1')</script>"
          "<img src=x onerror=\"document.documentElement.setAttribute('data-pwned','2')\">")
CUTLASS = "void cutlass::Kernel<cutlass::gemm::kernel::GemmUniversal<float, 128>>(Params)"
_CONSOLE = re.compile(r":CONSOLE[:(\]]")


def _tool(name: str) -> str:
    p = shutil.which(name)
    if p is None:
        pytest.fail(f"{name} not found: install it (apt-get install -y chromium poppler-utils)")
    return p


def _chromium(tmp: Path, *args: str) -> subprocess.CompletedProcess:
    ud = tmp / "chrome-profile"
    cmd = [_tool("chromium"), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
           "--no-first-run", "--disable-background-networking", "--disable-component-update",
           "--disable-sync", f"--user-data-dir={ud}", "--enable-logging=stderr", "--v=0",
           *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def _dom(tmp: Path, page: Path) -> str:
    res = _chromium(tmp, "--dump-dom", page.as_uri())
    assert res.returncode == 0, res.stderr[-2000:]
    console = [ln for ln in res.stderr.splitlines() if _CONSOLE.search(ln)]
    assert console == [], f"console messages: {console}"
    return res.stdout


def _pdf_pages(pdf: Path) -> list[tuple[float, float]]:
    """Every page's size in points (pdfinfo -f 1 -l N)."""
    info = subprocess.run([_tool("pdfinfo"), str(pdf)], capture_output=True, text=True,
                          timeout=60)
    assert info.returncode == 0, info.stderr
    n = int(re.search(r"^Pages:\s+(\d+)", info.stdout, re.M).group(1))
    per = subprocess.run([_tool("pdfinfo"), "-f", "1", "-l", str(n), str(pdf)],
                         capture_output=True, text=True, timeout=60).stdout
    sizes = [(float(a), float(b)) for a, b in
             re.findall(r"^Page\s+\d+ size:\s+([\d.]+) x ([\d.]+) pts", per, re.M)]
    assert len(sizes) == n
    return sizes


def _pdf_text(pdf: Path) -> list[str]:
    """The text of each page (pdftotext; pages split at form feeds)."""
    out = subprocess.run([_tool("pdftotext"), "-layout", str(pdf), "-"], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.split("\f")[:-1]


@pytest.fixture(scope="module")
def poisoned(tmp_path_factory):
    """The 8-rank DLRM trace with its two top kernels renamed to hostile/templated names."""
    t = ingest_cached(SHARED / "kineto" / "dlrm-v100-8rank")
    ks = kernel_stats(t, top=2)
    strings = list(t.strings)
    for name, new in zip(ks["name"], [INJECT + " ncclKernel_SendRecv", CUTLASS]):
        strings[strings.index(name)] = new
    t2 = dataclasses.replace(t, strings=strings)
    d = tmp_path_factory.mktemp("report")
    rep = build_report(t2)  # analysed once, written both ways
    html = write_html(rep, d / "dlrm.html")
    pdf = write_pdf(rep, d / "dlrm.pdf")
    return t2, rep, html, pdf, d


@pytest.fixture(scope="module")
def whatif_report(tmp_path_factory):
    import retime.replay as replay
    t = ingest_cached(SHARED / "kineto" / "dlrm-v100-8rank")
    w = replay.whatif(t, {"hardware.host_speedup": 2.0})
    d = tmp_path_factory.mktemp("whatif")
    rep = build_report(w, baseline=t, title="what-if")
    return t, w, rep, write_html(rep, d / "w.html"), write_pdf(rep, d / "w.pdf", paper="letter"), d


def test_html_report_in_chromium(poisoned):
    t, rep, html, _, d = poisoned
    raw = html.read_text(encoding="utf-8")
    # self-contained: no external resource of any kind
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:|//)""", raw)
    assert "<link" not in raw and "@import" not in raw
    # autoescaped in the source
    assert "&lt;script&gt;document.documentElement" in raw
    assert "<script>document.documentElement" not in raw
    dom = _dom(d, html)
    assert "data-pwned" not in dom.split("<body", 1)[0]  # the <html> tag was not touched
    # the hostile name is shown literally (as text, in the full name a reader can hover)
    assert "&lt;script&gt;document.documentElement.setAttribute" in dom
    assert "GemmUniversal&lt;float, 128&gt;" in dom
    # the headline, derived independently from the analysis
    summary = dom.split('id="summary"', 1)[1].split("</section>", 1)[0]
    run_ = RunAnalysis(t)
    assert fmt_ns(run_.step_ns) in summary
    assert fmt_ns(run_.cp.attrs["length_ns"]) in summary
    assert f"{t.n_ops:,}" in summary and "8x Tesla V100-SXM2-32GB" in summary
    assert summary.count("<li>") == 3  # three findings
    # headers in words with units: no column names, no bare nanoseconds
    ths = [html_lib.unescape(re.sub("<[^>]+>", "", h)) for h in re.findall(r"<th[^>]*>(.*?)</th>",
                                                                         dom)]
    assert ths and all("_" not in h and "(ns)" not in h for h in ths), ths
    assert "Time on the path (ms)" in ths and "Share of GPU time" in ths
    # every figure has a legend
    figs = re.findall(r'<figure id="fig-([\w]+)" data-legend="([^"]*)"', dom)
    assert {k for k, _ in figs} == {"breakdown", "timeline", "launch_latency", "icicle",
                                    "roofline"}  # V100: a built-in profile (v100-sxm2)
    assert all(leg for _, leg in figs)
    # panels that do not apply are left out, not drawn empty
    for absent in ("pipeline", "memory", "efficiency", "fig-rank_time", "fig-pipeline"):
        assert f'id="{absent}"' not in dom
    # the table of contents links to every section
    toc = dom.split('id="toc"', 1)[1].split("</nav>", 1)[0]
    assert re.findall(r'href="#(\w+)"', toc) == [s.key for s in rep.sections]


def test_html_report_escaping_holds_without_csp(poisoned):
    """Even with the page's Content-Security-Policy removed, nothing injected runs."""
    _, _, html, _, d = poisoned
    raw = html.read_text(encoding="utf-8")
    probe = ("<script>window.__errs=[];window.addEventListener('error',function(e){"
             "window.__errs.push(String(e.message))});"
             "var _ce=console.error;console.error=function(){window.__errs.push("
             "Array.prototype.join.call(arguments,' '));_ce.apply(console,arguments)};"
             "window.addEventListener('load',function(){document.documentElement.setAttribute("
             "'data-probe',JSON.stringify({errs:window.__errs,title:document.title}))})"
             "</script>")
    no_csp = re.sub(r'<meta http-equiv="Content-Security-Policy"[^>]*>', "", raw)
    assert no_csp != raw
    page = d / "probe.html"
    page.write_text(no_csp.replace("<head>", "<head>" + probe, 1), encoding="utf-8")
    res = _chromium(d, "--dump-dom", page.as_uri())
    assert res.returncode == 0
    head = res.stdout.split("<head", 1)[0]
    assert "data-pwned" not in head
    m = re.search(r"data-probe=\"([^\"]*)\"", head)
    assert m, "the probe script did not run; the test harness is broken"
    probe_out = json.loads(m.group(1).replace("&quot;", '"').replace("&amp;", "&"))
    assert probe_out["errs"] == []
    assert probe_out["title"].startswith("retime report")


def test_html_report_screenshot(poisoned):
    _, _, html, _, d = poisoned
    shot = d / "shot.png"
    res = _chromium(d, "--window-size=1400,2400", f"--screenshot={shot}", html.as_uri())
    assert res.returncode == 0 and shot.is_file(), res.stderr[-2000:]
    import matplotlib.image as mpimg
    img = mpimg.imread(shot)
    assert img.shape[0] == 2400 and img.shape[1] == 1400
    # text and figures: a real share of pixels is not background white
    ink = (img[..., :3].mean(axis=2) < 0.9).mean()
    assert ink > 0.02


def test_whatif_report_names_the_scenario_in_chromium(whatif_report):
    t, w, rep, html, _, d = whatif_report
    dom = _dom(d, html)
    labels = re.findall(r'<div class="kpi-label">([^<]*)</div>', dom)
    assert labels[:3] == ["Measured step", "What-if step", "Change"]
    values = re.findall(r'<div class="kpi-value" data-key="[^"]*">([^<]*)</div>', dom)
    assert values[:2] == [fmt_ns(RunAnalysis(t).step_ns), fmt_ns(RunAnalysis(w).step_ns)]
    scen = dom.split('id="scenario"', 1)[1].split("</table>", 1)[0]
    assert "hardware.host_speedup" in scen and "<td>2</td>" in scen
    # the comparison comes first, with the waterfall and the per-rank changes
    keys = re.findall(r'<section class="report-section" id="(\w+)"', dom)
    assert keys[0] == "comparison"
    figs = dict(re.findall(r'<figure id="fig-([\w]+)" data-legend="([^"]*)"', dom))
    assert {"waterfall", "rank_deltas"} <= set(figs)
    assert "part grew" in figs["waterfall"] and "faster" in figs["rank_deltas"]


def test_pdf_is_a_document(poisoned):
    _, rep, _, pdf, d = poisoned
    sizes = _pdf_pages(pdf)
    assert set(sizes) == {(595.28, 841.89)}  # A4, every page
    assert 3 <= len(sizes) <= 8  # a document, not a page per table
    pages = _pdf_text(pdf)
    assert len(pages) == len(sizes)
    for i, p in enumerate(pages, 1):
        assert f"page {i} of {len(pages)}" in p
    # page 1: headline and a table of contents with every section and its page number
    toc = pages[0].split("Contents", 1)[1]
    for s in rep.sections:
        m = re.search(rf"{re.escape(s.title)}\s*[. ]*\s(\d+)\s*$", toc, re.M)
        assert m, s.title
        assert s.title in pages[int(m.group(1)) - 1]
    # several tables share a page
    captions = [t.caption for s in rep.sections for t in s.tables]
    assert max(sum(c in p for c in captions) for p in pages) >= 3
    # every page renders with ink on it
    out = d / "pg"
    r = subprocess.run([_tool("pdftoppm"), "-r", "30", "-png", str(pdf), str(out)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    pngs = sorted(d.glob("pg*.png"))
    assert len(pngs) == len(sizes)
    import matplotlib.image as mpimg
    for p in pngs:
        img = mpimg.imread(p)
        ink = (img[..., :3].mean(axis=2) < 0.9).mean()
        assert ink > 0.002, f"{p.name} is blank"


def test_pdf_letter_and_scenario(whatif_report):
    *_, pdf, _ = whatif_report
    assert set(_pdf_pages(pdf)) == {(612.0, 792.0)}
    first = _pdf_text(pdf)[0]
    assert "hardware.host_speedup" in first and "MEASURED STEP" in first


def test_pipeline_report_pages(tmp_path):
    """A modeled pipeline run: the Gantt and the pipeline section are there, with legends."""
    import retime.collectors.synth as synth
    t = synth.synthesize("gpt3-1.3b", "a100-80gb", tp=1, pp=4, dp=1, global_batch=8,
                         micro_batch=1)
    rep = build_report(t)
    html = write_html(rep, tmp_path / "pp.html")
    dom = _dom(tmp_path, html)
    figs = dict(re.findall(r'<figure id="fig-([\w]+)" data-legend="([^"]*)"', dom))
    assert "pipeline" in figs and figs["pipeline"].startswith("forward|backward")
    assert 'id="pipeline"' in dom and 'id="efficiency"' in dom
