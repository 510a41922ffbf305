"""Older rules, sealed: how rules/2, /3 and /4 judged, kept so `kvprobe verify` re-derives a verdict written under
them byte for byte whatever the current rules become.

Every module here imports only the standard library, numpy, scipy and this package (tests/verdict/test_sealed.py
holds it to that, and pins each module's text). The modules beside rules_v2 are copies of the live judging code
(kvprobe.stats, kvprobe.verdict.checks, kvprobe.verdict.build.decide) taken when rules/5 was current, which judge
rules/3 and /4 through the switches those rules used (answers_rules4, speed_rules3, load_checks(cap_advice=False),
the t statistic of a recorded design that names none); parts that only rules/5 reached are left as they were, so
the copy stays a copy. A later rules bump seals its predecessor the same way, never by editing these.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kvprobe.verdict.sealed import rules_v2
from kvprobe.verdict.sealed.checks import RULES3_PROBES, RULES4_PROBES
from kvprobe.verdict.sealed.decide import decide

RULES_2, RULES_3, RULES_4 = rules_v2.RULES, "kvprobe.rules/3", "kvprobe.rules/4"
SCHEMA_1, SCHEMA_2, SCHEMA_3 = rules_v2.SCHEMA, "kvprobe.verdict/2", "kvprobe.verdict/3"

# (rules, schema) -> the decision those rules make from a verdict's inputs. rules/4 was also written in schema 2:
# the same decisions, signed without the fields schema 3 added.
DECIDERS: dict[tuple[str, str], Callable[[dict[str, Any]], dict[str, Any]]] = {
    (RULES_2, SCHEMA_1): rules_v2.decide,
    (RULES_3, SCHEMA_2): lambda inputs: decide(inputs, RULES3_PROBES, structured=False),
    (RULES_4, SCHEMA_3): lambda inputs: decide(inputs, RULES4_PROBES),
    (RULES_4, SCHEMA_2): lambda inputs: decide(inputs, RULES4_PROBES, structured=False),
}
