"""Reports: Markdown and a self-contained HTML file, rendered for real in headless Chromium."""

from __future__ import annotations

import os
import random
import re
import shutil
import subprocess

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image
from verdict_inputs import Measurements, needle_cases, perplexity_rows

from kvprobe.cli import main
from kvprobe.report.plots import request_latencies
from kvprobe.report.standing import checked, this_run
from kvprobe.report.write import render_reports
from kvprobe.verdict.build import write_verdict
from kvprobe.verdict.verify import examine

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]


@pytest.fixture
def sample_run(tmp_path):
    """A finished run: reference, a good candidate and a wrecked one, with per-request latencies."""
    m = Measurements()
    m.servers.append(("int8", "candidate", 200_000, "int8_per_token_head"))
    m.perplexity["servers"]["int8"] = perplexity_rows(1.25, 0.05)  # about +250%
    m.needle["cases"] += needle_cases("int8", 2, truncated=3)
    m.needle["servers"]["int8"] = {"hit": 2, "miss": 35, "truncated": 3, "error": 0, "recall": 2 / 37}
    m.load["servers"]["int8"] = {"cases": m.load["servers"]["cand"]["cases"]}
    run = m.write(tmp_path / "run")
    rng = random.Random(0)
    for server in ("ref", "cand", "int8"):
        for _ in range(50):
            run.event("load_request", server=server, agents=4, status="ok", ttft=rng.lognormvariate(-2, 0.4),
                      e2e=rng.lognormvariate(0.5, 0.3))
        run.event("load_request", server=server, agents=4, status="incomplete", ttft=0.1, e2e=99.0)
    write_verdict(run)
    return run


def test_markdown_and_html_carry_the_decisions_and_the_plots(sample_run):
    verdict = sample_run.read_json("verdict.json")
    rendered = render_reports(sample_run, verdict, this_run(sample_run))
    md = rendered.markdown.read_text()
    assert "**Recommendation: cand**" in md
    assert re.search(r"\| int8 \| candidate \| int8_per_token_head \| 200,000 \| 2.00x \| reject \|", md)
    for plot in ("capacity", "perplexity", "load", "latency"):
        assert f"(plots/{plot}.png)" in md and (sample_run.path / "plots" / f"{plot}.png").stat().st_size > 5000
    html = rendered.html.read_text()
    assert html.count('<img class="plot"') == 4 and html.count("data:image/png;base64,") == 4
    # Self-contained: nothing is fetched from anywhere.
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:|//)""", html)
    assert "<link" not in html
    assert "needle probe not run" not in html  # needle.json is there: the absence names the real reason
    # The sample needle.json has only the documented keys (no target length/depth per case), so no
    # heatmap can be drawn: the report says exactly why instead of showing nothing.
    assert rendered.absent == ["Needle heatmaps: needle.json has no cases with target_length and target_depth"]


def test_the_needle_probes_own_heatmaps_are_embedded(sample_run):
    data = sample_run.read_json("needle.json")
    render_reports(sample_run, sample_run.read_json("verdict.json"), this_run(sample_run))
    png = (sample_run.path / "plots" / "capacity.png").read_bytes()  # any real PNG will do
    (sample_run.path / "needle").mkdir()
    (sample_run.path / "needle" / "heatmap-ref.png").write_bytes(png)
    sample_run.write_json("needle.json", {**data, "heatmaps": {"ref": "needle/heatmap-ref.png",
                                                               "gone": "needle/missing.png"}})
    rendered = render_reports(sample_run, sample_run.read_json("verdict.json"), this_run(sample_run))
    assert sample_run.path / "needle" / "heatmap-ref.png" in rendered.plots
    assert "(needle/heatmap-ref.png)" in rendered.markdown.read_text()
    assert rendered.html.read_text().count('<img class="plot"') == 5


def test_latencies_come_from_the_events_log(sample_run):
    data = request_latencies(sample_run)
    assert sorted(data) == ["cand", "int8", "ref"]
    assert len(data["ref"]["ttft"]) == 50 and len(data["cand"]["e2e"]) == 50  # the incomplete one is left out
    assert max(data["cand"]["e2e"]) < 99


def test_a_run_without_optional_probes_still_renders(tmp_path):
    m = Measurements()
    m.probes_requested = ["capacity"]
    run = m.write(tmp_path / "run")
    verdict, _ = write_verdict(run)
    rendered = render_reports(run, verdict, this_run(run))
    assert [p.name for p in rendered.plots] == ["capacity.png"]
    assert any("perplexity probe not run" in a for a in rendered.absent)
    assert "perplexity probe not run" in rendered.html.read_text()


def test_report_command_rerenders_a_run_and_an_unfinished_one(sample_run, tmp_path):
    """Both are rendered, and neither is signed: each says NOT verified first and exits 1, though cand is adopted
    (tests/cli/test_report_show.py has the signed runs)."""
    (sample_run.path / "report.html").unlink(missing_ok=True)
    result = CliRunner().invoke(main, ["report", str(sample_run.path)])
    assert result.exit_code == 1, result.output
    assert (sample_run.path / "report.html").is_file() and "cand: adopt" in result.output
    assert result.stdout.startswith("NOT verified: ") and "no signature: the verdict is unsigned" in result.stdout
    unfinished = Measurements().write(tmp_path / "unfinished")
    result = CliRunner().invoke(main, ["report", str(unfinished.path)])
    assert result.exit_code == 1 and result.stdout.startswith("NOT verified: no verdict.json (the run did not finish)")
    assert not (unfinished.path / "verdict.json").exists()
    missing = CliRunner().invoke(main, ["report", str(tmp_path / "nowhere")])
    assert missing.exit_code == 2 and "not a kvprobe run directory" in missing.output


def _chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if path := shutil.which(name):
            return path
    if os.environ.get("CI"):
        pytest.fail("chromium is not installed: .ci/run must `apt-get install -y chromium`")
    pytest.skip("chromium not installed (apt-get install -y chromium)")


def test_html_renders_in_headless_chromium(sample_run, tmp_path):
    chromium = _chromium()
    rendered = render_reports(sample_run, sample_run.read_json("verdict.json"), this_run(sample_run))
    url = rendered.html.resolve().as_uri()
    flags = [*CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'profile'}"]
    shot = tmp_path / "shot.png"
    subprocess.run([chromium, *flags, "--hide-scrollbars", "--window-size=1280,2200", f"--screenshot={shot}", url],
                   check=True, capture_output=True, timeout=180)
    dom = subprocess.run([chromium, *flags, "--virtual-time-budget=5000", "--dump-dom", url],
                         check=True, capture_output=True, text=True, timeout=180).stdout

    status = re.search(r'id="plot-status" data-total="(\d+)" data-loaded="(\d+)" data-broken="(\d+)"', dom)
    assert status, "the page's script did not run"
    total, loaded, broken = map(int, status.groups())
    assert total >= 4 and loaded == total and broken == 0

    image = np.asarray(Image.open(shot).convert("RGB")).astype(int)
    assert image.shape == (2200, 1280, 3)
    non_white = float((image.min(axis=2) < 235).mean())
    assert non_white > 0.05, f"screenshot is (nearly) blank: {non_white:.1%} non-white"
    # The capacity bars are drawn in the decision colours: the adopted candidate's green and the
    # rejected one's red must be on screen in quantity (a table badge alone is a few hundred pixels).
    green = int((np.abs(image - [44, 160, 44]).max(axis=2) < 12).sum())
    red = int((np.abs(image - [214, 39, 40]).max(axis=2) < 12).sum())
    assert green > 5000 and red > 5000, (green, red)


def test_the_first_screen_holds_each_decision_and_its_axes(sample_run, tmp_path):
    """Rendered for real: at 1280x800 the recommendation and every candidate's card (its decision badge
    and the capacity, quality, speed and serving lines) are on the first screen, and each badge is
    painted in its decision's colour in the screenshot."""
    import json

    chromium = _chromium()
    verdict = sample_run.read_json("verdict.json")
    rendered = render_reports(sample_run, verdict, checked(sample_run, examine(sample_run.path)))
    url = rendered.html.resolve().as_uri()
    flags = [*CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1280,800",
             "--hide-scrollbars", "--force-device-scale-factor=1"]
    shot = tmp_path / "first.png"
    subprocess.run([chromium, *flags, f"--screenshot={shot}", url], check=True, capture_output=True, timeout=180)
    dom = subprocess.run([chromium, *flags, "--virtual-time-budget=5000", "--dump-dom", url],
                         check=True, capture_output=True, text=True, timeout=180).stdout
    found = re.search(r'id="layout" data-rects="([^"]*)"', dom)
    assert found and found.group(1), "the page's script did not run"
    layout = json.loads(found.group(1).replace("&quot;", '"'))
    assert layout["recommendation"]["y"] + layout["recommendation"]["h"] <= 800
    # the verdict is unsigned: that is said above the recommendation, on the first screen
    assert layout["standing"]["y"] + layout["standing"]["h"] <= layout["recommendation"]["y"]
    assert re.search(r'id="standing">NOT verified: \S+verdict.json.sig: no signature', dom)
    cards = {c["name"]: c for c in layout["cards"]}
    assert {n: c["decision"] for n, c in cards.items()} == {n: d["decision"] for n, d in verdict["decisions"].items()}
    image = np.asarray(Image.open(shot).convert("RGB")).astype(int)
    assert image.shape == (800, 1280, 3)
    colours = {"adopt": [44, 160, 44], "reject": [214, 39, 40], "inconclusive": [255, 159, 28]}
    for name, card in cards.items():
        box = card["card"]
        assert box["y"] + box["h"] <= 800, f"{name}'s card ends at {box['y'] + box['h']:.0f} px, below the first screen"
        tag = card["tag"]
        y0, y1, x0, x1 = int(tag["y"]), int(tag["y"] + tag["h"]), int(tag["x"]), int(tag["x"] + tag["w"])
        badge = image[y0:y1, x0:x1]
        want = colours[card["decision"]]
        share = float((np.abs(badge - want).max(axis=2) < 16).mean())
        assert share > 0.3, f"{name}'s {card['decision']} badge is not painted: {share:.0%} of it in its colour"
    # every axis of the summary is in each card, as text the page lays out (not just in the HTML source)
    glance = dom[dom.index('id="glance"'):]
    glance = glance[:glance.index("</section>")]
    for axis in ("capacity", "quality", "speed", "serving"):
        assert glance.count(f"<th>{axis}</th>") == len(verdict["decisions"])
