"""--budget: the durations it is given (the sizing is tests/evaluate/test_budget_plan.py's)."""

from __future__ import annotations

import pytest

from kvprobe.errors import ConfigError
from kvprobe.run.budget import parse_budget


@pytest.mark.parametrize(("text", "seconds"), [("5m", 300), ("90s", 90), ("1h30m", 5400), ("300", 300),
                                               ("2.5m", 150)])
def test_durations(text: str, seconds: float) -> None:
    assert parse_budget(text) == seconds


@pytest.mark.parametrize("text", ["5 minutes", "m5", "10s", "", "5m3"])
def test_bad_durations_are_one_line(text: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_budget(text)
    assert err.value.problems[0].startswith(f"--budget {text!r}: ")
