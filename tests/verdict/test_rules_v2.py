"""rules/2 stays re-derivable: every recorded rules/2 verdict (real runs on an Intel Xeon with AMX and on an
NVIDIA H200) gives the same decisions, checks, recommendation and exit code under kvprobe.verdict.sealed.rules_v2."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from kvprobe.verdict.build import rederive, same
from kvprobe.verdict.sealed import rules_v2

RUNS = Path(__file__).parents[1] / "fixtures" / "runs"
INPUT_KEYS = ("reference", "order", "bars", "servers", "pin", "broken", "probes", "probes_status")


RULES2_RUNS = sorted(p.name for p in RUNS.iterdir()
                     if p.is_dir() and orjson.loads((p / "verdict.json").read_bytes())["rules"] == rules_v2.RULES)


def test_the_recorded_rules2_runs_are_there() -> None:
    assert RULES2_RUNS == ["h200-gpu", "h200-gpu-hybrid-kv", "h200-gpu-hybrid-ssm", "xeon-amx-demo"]


@pytest.mark.parametrize("run", RULES2_RUNS)
def test_a_recorded_rules2_verdict_re_derives_exactly(run: str) -> None:
    verdict = orjson.loads((RUNS / run / "verdict.json").read_bytes())
    assert verdict["rules"] == rules_v2.RULES and verdict["schema"] == rules_v2.SCHEMA
    again = rules_v2.decide({k: verdict[k] for k in INPUT_KEYS})
    # Equal to the last digits that can differ between CPU kinds: these were written on an Intel Xeon and
    # an H200 host, and numpy's vector log/exp differ in the last bit between AVX-512 and AVX2.
    assert same(verdict["decisions"], again["decisions"])
    assert again["recommendation"] == verdict["recommendation"]
    assert again["exit_code"] == verdict["exit_code"]
    assert rederive(verdict) == []


def test_same_allows_the_last_digits_only() -> None:
    assert same({"a": [0.33798956548294345]}, {"a": [0.3379895654829437]})
    assert not same({"a": [0.337989565]}, {"a": [0.337989566]})
    assert not same({"a": "pass"}, {"a": "fail"})
    assert not same({"a": 1}, {"a": 1.0})


def test_a_rules2_run_directory_agrees_with_its_verdict_where_both_forms_carry_numbers(tmp_path) -> None:
    import gzip
    import shutil

    from kvprobe.verdict.verify import check_against_run

    run = tmp_path / "xeon"
    shutil.copytree(RUNS / "xeon-amx-demo", run)
    for path in run.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)
    with gzip.open(run / "events.jsonl.gz", "rb") as packed:
        (run / "events.jsonl").write_bytes(packed.read())
    verdict = orjson.loads((run / "verdict.json").read_bytes())
    assert check_against_run(run / "verdict.json", verdict) == []
    verdict["probes"]["perplexity"]["servers"]["fp8"]["bits_per_byte"] = 4.0  # a number both forms carry
    assert check_against_run(run / "verdict.json", verdict) == ["probes.perplexity.servers.fp8.bits_per_byte"]
