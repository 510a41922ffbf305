"""rules/5, sealed when rules/6 became current (2026-12-06): copies of the live judging code as it was then
(kvprobe.stats -> stats, client_limit, paired_exact, power, sequential; kvprobe.verdict.checks -> checks, common,
answers, quality, speed; kvprobe.verdict.build's decision -> decide), their imports pointed here. Left out of
the copy: checks.live_checks (the table printed while a run goes; it reads the live evidence readers and decides
nothing). The bars and exit codes are the sealed ones beside this package, unchanged since rules/4.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kvprobe.verdict.sealed.rules5.decide import decide

RULES_5, SCHEMA_3 = "kvprobe.rules/5", "kvprobe.verdict/3"
DECIDERS: dict[tuple[str, str], Callable[[dict[str, Any]], dict[str, Any]]] = {(RULES_5, SCHEMA_3): decide}
