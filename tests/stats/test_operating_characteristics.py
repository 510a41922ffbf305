"""benchmarks/operating_characteristics.py --quick, as CI runs it: every gated target of issue 33 holds for the
shipped defaults (P(adopt | equal) >= 0.8 on the cpu and gpu spreads, P(pass | at a bar) <= 2.5% under every
block noise, P(fail | twice a bar) >= 0.8 on every gating axis), one figure a line naming its scenario."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BENCHMARK = Path(__file__).parents[2] / "benchmarks" / "operating_characteristics.py"


def test_the_shipped_defaults_meet_every_gated_target() -> None:
    done = subprocess.run([sys.executable, str(BENCHMARK), "--quick"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert lines[-1] == "every gated target holds"
    figures = [line for line in lines if line.rstrip().endswith((" ok", " FAIL", " info"))]
    assert {line.split()[0] for line in figures} >= {"quality", "cpu", "gpu", "normal", "skewed", "ar1"}
    assert not [line for line in figures if line.endswith("FAIL")]
    for scenario in ("cpu", "gpu"):
        assert any(line.startswith(scenario) and "P(adopt | equal)" in line and line.endswith("ok") for line in figures)
    twice = [line for line in figures if "P(fail | twice the bar)" in line and line.endswith("ok")]
    # speed on each platform, perplexity, and the four 0/1 bars at d = 5% beside the loss and with nothing gained
    assert len(twice) == 2 + 1 + 4 * 2, "\n".join(twice)
