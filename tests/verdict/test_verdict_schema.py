"""The published verdict schema (kvprobe.verdict.schema): the checked-in JSON Schema is the model's, every
recorded verdict and every verdict kvprobe builds follows it, the current schema's structured fields say
what the words say, and `kvprobe verify` refuses a verdict that breaks its schema before re-deriving it."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any, get_args

import orjson
import pytest
from click.testing import CliRunner
from recorded import RUNS, rejudge
from verdict_inputs import Measurements

from kvprobe.cli import main
from kvprobe.errors import SchemaViolation
from kvprobe.verdict import schema as verdict_schema
from kvprobe.verdict.build import (
    DECISIONS,
    INPUT_KEYS,
    RULES,
    RULES_4,
    SCHEMA,
    SEALED,
    build_verdict,
    decider,
    rederive,
    verdict_bytes,
    write_verdict,
)
from kvprobe.verdict.checks import STRUCTURED_KEYS
from kvprobe.verdict.evidence import PROBES
from kvprobe.verdict.schema import CHECK_ID, REGENERATE, SCHEMA_FILE, VerdictModelError, problems, schema_text
from kvprobe.verdict.sealed import rules_v2
from kvprobe.verdict.sign import allowed_signers_line, load_signing_key, sign_file
from kvprobe.verdict.verify import verify_verdict

RECORDED = sorted(p.parent.name for p in RUNS.glob("*/verdict.json"))


def _published() -> Any:
    """A validator for the checked-in JSON Schema file itself (jsonschema comes with check-jsonschema)."""
    jsonschema = pytest.importorskip("jsonschema")
    schema = orjson.loads(SCHEMA_FILE.read_bytes())
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def _checks(verdict: dict) -> list[dict]:
    return [c for d in verdict["decisions"].values() for c in d["checks"]]


@pytest.fixture(scope="module")
def current(tmp_path_factory) -> dict:
    """A real run (the Xeon demo: client-limited blocks among its load cases) judged now, as its bytes."""
    _, verdict = rejudge("xeon-amx-demo", tmp_path_factory.mktemp("xeon"))
    return orjson.loads(verdict_bytes(verdict))


def test_the_checked_in_schema_is_the_models() -> None:
    assert SCHEMA_FILE.is_file(), f"{SCHEMA_FILE} is missing: write it with `{REGENERATE}` (or scripts/schema)"
    if SCHEMA_FILE.read_text() != schema_text():
        pytest.fail(f"schemas/{SCHEMA_FILE.name} differs from the verdict model (kvprobe/verdict/schema.py): "
                    f"regenerate it with `{REGENERATE}` (or scripts/schema) and commit it", pytrace=False)


def test_the_model_names_every_version_rule_set_decision_and_probe_kvprobe_has() -> None:
    assert {SCHEMA, *(s for _, s in SEALED)} == set(verdict_schema.SCHEMA_VERSIONS)
    assert {RULES, *(r for r, _ in SEALED)} == set(get_args(verdict_schema.RulesVersion))
    assert get_args(verdict_schema.DecisionKind) == DECISIONS
    assert set(get_args(verdict_schema.Probe)) == set(PROBES)
    assert rules_v2.SCHEMA not in verdict_schema.CHECK_REQUIRES  # rules/2 checks had no ids


@pytest.mark.parametrize("name", RECORDED)
def test_every_recorded_verdict_follows_its_schema(name: str) -> None:
    data = (RUNS / name / "verdict.json").read_bytes()
    assert problems(data) == []
    errors = [e.message for e in _published().iter_errors(orjson.loads(data))]
    assert errors == []


def test_a_current_verdict_follows_the_model_and_the_published_schema(current: dict) -> None:
    assert current["schema"] == SCHEMA and current["rules"] == RULES
    assert problems(orjson.dumps(current)) == []
    assert [e.message for e in _published().iter_errors(current)] == []
    assert rederive(current) == []


def test_every_check_has_an_id_in_the_grammar_and_ids_are_unique(current: dict) -> None:
    for decision in current["decisions"].values():
        ids = [c["id"] for c in decision["checks"]]
        assert len(ids) == len(set(ids))
        assert all(re.match(CHECK_ID, i) for i in ids), ids


def test_a_load_case_is_also_typed_fields(current: dict) -> None:
    guards = [c for c in _checks(current) if c["probe"] == "load" and c["case"]]
    assert guards
    for check in guards:
        words = dict(part.split("=", 1) for part in check["case"].split())
        fields = check["case_fields"]
        assert {k: str(v) for k, v in fields.items()} == words
        assert isinstance(fields["agents"], int) and check["id"].startswith(f"load.{check['case'].replace(' ', '.')}.")
    tasks = [c for c in _checks(current) if c["probe"] == "tasks"]
    assert tasks and all(c["case_fields"] == {"task": c["case"]} for c in tasks)
    endpoint = next(c for c in _checks(current) if c["id"] == "load.endpoint.throughput_drop")
    assert endpoint["case"] is None and [f["agents"] for f in endpoint["scope_cases"]] == [1, 2, 4, 8, 16]


def test_client_limited_blocks_are_a_count_and_a_reason_beside_the_words(current: dict) -> None:
    load = [c for c in _checks(current) if c["probe"] == "load"]
    for check in load:
        dropped, why = check["dropped_client_limited"], check["client_limited_reason"]
        assert isinstance(dropped, int) and (why is None) == (dropped == 0), check["id"]
        if check.get("sequential"):
            assert dropped == check["sequential"]["dropped_client_limited"]
        if dropped:
            # the words said it before the fields did, and still do
            assert "client-limited" in check["text"] and re.match(r"\S+ block \d+ at shape=\S+ agents=\d+: ", why)
    endpoint = next(c for c in load if c["id"] == "load.endpoint.throughput_drop")
    assert endpoint["dropped_client_limited"] >= 1 and "the client" in endpoint["client_limited_reason"]


def test_each_schema_version_requires_its_fields_in_the_model_and_the_published_schema(current: dict) -> None:
    published = _published()
    cases = {
        "id": lambda c: c["probe"] == "perplexity",
        "case_fields": lambda c: c["probe"] == "tasks",
        "dropped_client_limited": lambda c: c["probe"] == "load",
    }
    for field, pick in cases.items():
        bad = copy.deepcopy(current)
        cand = next(iter(bad["decisions"]))
        check = next(c for c in bad["decisions"][cand]["checks"] if pick(c))
        index = bad["decisions"][cand]["checks"].index(check)
        del check[field]
        found = problems(orjson.dumps(bad))
        assert found and found[0].startswith(f"decisions.{cand}.checks.{index}: no {field}"), found
        assert any(field in e.message for e in published.iter_errors(bad))
    # a rules/2 verdict had no ids: as schema 1 it is fine, called schema 2 it is not
    old = orjson.loads((RUNS / "h200-gpu" / "verdict.json").read_bytes())
    assert problems(orjson.dumps(old)) == []
    assert problems(orjson.dumps(old | {"schema": "kvprobe.verdict/2"}))[0].endswith("kvprobe.verdict/2 requires it)")


def test_rules4_in_the_earlier_schema_still_rederives(current: dict) -> None:
    """A rules/4 verdict signed before schema 3 lacks the structured fields; it still verifies as it was, under
    rules/4's own checks (answers_rules4), which size the Xeon's kvprobe_qa bar otherwise than rules/5."""
    rules4 = copy.deepcopy(current) | {"rules": RULES_4}
    assert rederive(rules4)  # the same numbers, decided under rules/5, are not what rules/4 says
    rules4.update(decider(RULES_4, SCHEMA)({k: rules4[k] for k in INPUT_KEYS}))
    rules4 = orjson.loads(verdict_bytes(rules4))
    assert problems(orjson.dumps(rules4)) == [] and rederive(rules4) == []
    older = copy.deepcopy(rules4) | {"schema": "kvprobe.verdict/2"}
    for decision in older["decisions"].values():
        decision["checks"] = [{k: v for k, v in c.items() if k not in STRUCTURED_KEYS} for c in decision["checks"]]
    assert problems(orjson.dumps(older)) == [] and rederive(older) == []
    # the same verdict called schema 3 lacks what schema 3 requires
    assert problems(orjson.dumps(older | {"schema": SCHEMA}))


def test_a_verdict_its_own_model_rejects_is_a_bug_not_a_result(tmp_path, monkeypatch) -> None:
    import kvprobe.verdict.build as verdict_module

    real = verdict_module.decide

    def wrong(inputs: dict, *args: Any, **kwargs: Any) -> dict:
        out = real(inputs, *args, **kwargs)
        out["decisions"]["cand"]["decision"] = "maybe"
        return out

    monkeypatch.setattr(verdict_module, "decide", wrong)
    run = Measurements().write(tmp_path / "run")
    with pytest.raises(VerdictModelError, match=r"decisions\.cand\.decision: Input should be 'invalid'"):
        build_verdict(run)
    assert not run.has("verdict.json")


@pytest.fixture
def signed(tmp_path) -> tuple[Path, Path, Any]:
    run = Measurements().write(tmp_path / "run")
    write_verdict(run)
    key = load_signing_key()
    sign_file(run.path / "verdict.json", key)
    allowed = tmp_path / "allowed_signers"
    allowed.write_text(allowed_signers_line("tester", key.key.public_key()) + "\n")
    return run.path, allowed, key


def _resign(path: Path, key: Any, edit: Any) -> None:
    verdict = orjson.loads(path.read_bytes())
    edit(verdict)
    path.write_bytes(verdict_bytes(verdict))
    sign_file(path, key)


def test_verify_fails_a_schema_violation_naming_the_field_before_rederiving(signed) -> None:
    run_dir, allowed, key = signed
    assert verify_verdict(run_dir, allowed).verdict["schema"] == SCHEMA
    path = run_dir / "verdict.json"
    # also a decision the numbers do not give: the schema is what is reported, it is checked first
    _resign(path, key, lambda v: v["decisions"]["cand"]["checks"][0].update(outcome="passed"))
    with pytest.raises(SchemaViolation, match=r"does not follow its schema 'kvprobe.verdict/3': "
                                              r"decisions\.cand\.checks\.0\.outcome: Input should be 'pass'"):
        verify_verdict(run_dir, allowed)
    result = CliRunner().invoke(main, ["verify", str(run_dir), "--allowed-signers", str(allowed)])
    assert result.exit_code == 1
    assert "decisions.cand.checks.0.outcome" in result.output and "decisions re-derived" not in result.output


def test_verify_names_a_missing_field_and_a_malformed_id(signed) -> None:
    run_dir, allowed, key = signed
    path = run_dir / "verdict.json"
    _resign(path, key, lambda v: v["recommendation"].pop("server"))
    with pytest.raises(SchemaViolation, match=r"recommendation\.server: Field required"):
        verify_verdict(run_dir, allowed)

    def bad_id(verdict: dict) -> None:
        verdict["recommendation"]["server"] = "cand"
        verdict["decisions"]["cand"]["checks"][0]["id"] = "perplexity delta"

    _resign(path, key, bad_id)
    with pytest.raises(SchemaViolation, match=r"checks\.0\.id: 'perplexity delta' is not a check id"):
        verify_verdict(run_dir, allowed)
