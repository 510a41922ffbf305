"""Hypothesis settings for the parser fuzz tests (issue 12).

CI runs a fixed, small number of examples per test, derandomized, so the suite takes about a minute
and a failure reproduces on any machine. KVPROBE_FUZZ_EXAMPLES raises the count for a long hunt, and
KVPROBE_FUZZ_SEED=random explores new examples each run (a found case is printed with its @example)."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

_EXAMPLES = int(os.environ.get("KVPROBE_FUZZ_EXAMPLES", "400"))
_RANDOM = os.environ.get("KVPROBE_FUZZ_SEED") == "random"

settings.register_profile(
    "kvprobe-fuzz",
    max_examples=_EXAMPLES,
    # Timing varies with the box (2 cores shared with vLLM servers): only wrong answers count.
    deadline=None,
    derandomize=not _RANDOM,
    # No example database: CI is reproducible from the code alone, and a long run writes nothing.
    database=None,
    print_blob=True,
    # The seeds are whole captures (a 7000-token completion, a 600-line /metrics): large by design.
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example],
)
settings.load_profile("kvprobe-fuzz")
