"""The HTML report in a real headless Chromium, and the PDF report through poppler.

Needs the Debian packages ``chromium`` and ``poppler-utils`` (``.ci/run`` installs them).
"""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from conftest import ingest_cached
from retime.analysis import build_report, kernel_stats, metrics, write_html, write_pdf
from retime.analysis.report import fmt_ns

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


@pytest.fixture(scope="module")
def poisoned(tmp_path_factory):
    """The 8-rank DLRM trace with its two top kernels renamed to hostile/templated names."""
    from conftest import SHARED
    t = ingest_cached(SHARED / "kineto" / "dlrm-v100-8rank")
    ks = kernel_stats(t, top=2)
    strings = list(t.strings)
    for name, new in zip(ks["name"], [INJECT + " ncclKernel_SendRecv", CUTLASS]):
        strings[strings.index(name)] = new
    t2 = dataclasses.replace(t, strings=strings)
    d = tmp_path_factory.mktemp("report")
    rep = build_report(t2)  # analysed once, written both ways
    html = write_html(rep, d / "dlrm.html")
    n_pages = 1 + sum(len(s.tables) + len(s.figures) for s in rep.sections)
    pdf = write_pdf(rep, d / "dlrm.pdf")
    return t2, html, pdf, d, n_pages


def test_html_report_in_chromium(poisoned):
    t, html, _, d, _ = poisoned
    raw = html.read_text(encoding="utf-8")
    # self-contained: no external resource of any kind
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:|//)""", raw)
    assert "<link" not in raw and "@import" not in raw
    # autoescaped in the source
    assert "&lt;script&gt;document.documentElement" in raw
    assert "<script>document.documentElement" not in raw
    assert "cutlass::Kernel&lt;cutlass::gemm::kernel::GemmUniversal&lt;float, 128&gt;&gt;" in raw

    res = _chromium(d, "--dump-dom", html.as_uri())
    assert res.returncode == 0, res.stderr[-2000:]
    dom = res.stdout
    console = [ln for ln in res.stderr.splitlines() if _CONSOLE.search(ln)]
    assert console == [], f"console messages: {console}"
    assert "data-pwned" not in dom.split("<body", 1)[0]  # the <html> tag was not touched
    # the names are shown literally (as text) in the rendered DOM
    assert "&lt;script&gt;document.documentElement.setAttribute" in dom
    assert "void cutlass::Kernel&lt;cutlass::gemm::kernel::GemmUniversal&lt;float, 128&gt;&gt;" in dom
    # summary numbers, derived independently from the analysis, are on the page
    m = metrics(t, with_critical_path=True)
    summary = dom.split('id="summary"', 1)[1].split("</section>", 1)[0]
    assert fmt_ns(m["step_ns"]) in summary
    assert fmt_ns(m["critical_path_ns"]) in summary
    assert f"{t.n_ops:,}" in summary
    assert summary.count("<li>") == 3  # three findings


def test_html_report_escaping_holds_without_csp(poisoned):
    """Even with the page's Content-Security-Policy removed, nothing injected runs."""
    _, html, _, d, _ = poisoned
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
    _, html, _, d, _ = poisoned
    shot = d / "shot.png"
    res = _chromium(d, "--window-size=1280,2000", f"--screenshot={shot}", html.as_uri())
    assert res.returncode == 0 and shot.is_file(), res.stderr[-2000:]
    import matplotlib.image as mpimg
    img = mpimg.imread(shot)
    assert img.shape[0] == 2000 and img.shape[1] == 1280
    # text and figures: a real share of pixels is not background white
    ink = (img[..., :3].mean(axis=2) < 0.9).mean()
    assert ink > 0.02


def test_pdf_report_pages_render(poisoned):
    _, _, pdf, d, expected = poisoned
    info = subprocess.run([_tool("pdfinfo"), str(pdf)], capture_output=True, text=True,
                          timeout=60)
    assert info.returncode == 0, info.stderr
    pages = int(re.search(r"^Pages:\s+(\d+)", info.stdout, re.M).group(1))
    # summary page + one page per table and per figure of the report
    assert pages == expected
    out = d / "pg"
    r = subprocess.run([_tool("pdftoppm"), "-r", "30", "-png", str(pdf), str(out)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    pngs = sorted(d.glob("pg*.png"))
    assert len(pngs) == pages
    import matplotlib.image as mpimg
    for p in pngs:
        img = mpimg.imread(p)
        ink = (img[..., :3].mean(axis=2) < 0.9).mean()
        assert ink > 0.002, f"{p.name} is blank"
    assert np.isfinite(ink)
