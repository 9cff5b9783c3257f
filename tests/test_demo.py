"""`retime demo` on the bundled sample: the README's first command."""

from __future__ import annotations

import json
import re

from retime.cli import run


def test_demo_end_to_end(tmp_path, capsys):
    assert run(["demo", "-o", str(tmp_path), "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["ranks"] == list(range(8)) and s["collectives"] == {"matched": 8, "unmatched": 0}
    assert all(r["error_pct"] == 0.0 for r in s["identity"])  # identity replay is exact
    sp = {next(iter(w["scenario"])): w["speedup"] for w in s["whatif"]}
    # DLRM here is host-bound: a faster CPU helps much more than a faster GPU
    assert sp["hardware.host_speedup"] > 1.2 > sp["hardware.compute_speedup"] >= 1.0
    html, pdf = (tmp_path / "dlrm-v100-8rank.html"), (tmp_path / "dlrm-v100-8rank.pdf")
    assert html.stat().st_size > 50_000 and pdf.read_bytes()[:4] == b"%PDF"
    text = html.read_text()
    # the headline tells the truth: measured and what-if side by side, the scenario named
    assert "what-if hardware.host_speedup = 2" in text.split("</title>")[0]
    labels = re.findall(r'<div class="kpi-label">([^<]*)</div>', text)
    assert labels[:3] == ["Measured step", "What-if step", "Change"]
    scen = text.split('id="scenario"', 1)[1].split("</table>", 1)[0]
    assert "hardware.host_speedup" in scen
    assert s["reports"] == [str(html), str(pdf)]
