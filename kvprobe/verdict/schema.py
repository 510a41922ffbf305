"""The verdict's published shape: a pydantic model of verdict.json, and the JSON Schema made from it.

One model for every schema version kvprobe still verifies (kvprobe.verdict/1, /2, /3): a field a later
version added is optional here, and what a version requires of its checks (an `id` from /2 on, the
structured fields from /3 on) is one table, `CHECK_REQUIRES`, that both the model's own check and the
published JSON Schema are made from. The top level is typed as far as verify and the reports read it;
per-probe evidence below that is free-form (`dict[str, Any]`) except for the load cases. Objects allow
keys the model does not name: a newer kvprobe may add some within a version.

The checked-in schemas/verdict.schema.json is this model's JSON Schema. After changing the model:
    .venv/bin/python -m kvprobe.verdict.schema        (or scripts/schema)
tests/verdict/test_verdict_schema.py fails, naming that command, while the file differs from the model.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from kvprobe.probes import ORDER

SCHEMA_FILE = Path(__file__).resolve().parents[2] / "schemas" / "verdict.schema.json"
REGENERATE = ".venv/bin/python -m kvprobe.verdict.schema"
SchemaVersion = Literal["kvprobe.verdict/1", "kvprobe.verdict/2", "kvprobe.verdict/3"]
RulesVersion = Literal["kvprobe.rules/2", "kvprobe.rules/3", "kvprobe.rules/4", "kvprobe.rules/5",
                       "kvprobe.rules/6"]
SCHEMA_VERSIONS: tuple[str, ...] = get_args(SchemaVersion)

# The grammar of a check id, `<probe>.<what>` or `<probe>.<case>.<what>`, where a case is a task's name
# or a load case's words with dots for spaces ("shape=default.agents=1"). Ids are stable across runs of
# the same config (a baseline keys on them), so this only describes them: it never renames one.
CHECK_ID = (r"^(perplexity\.delta"
            r"|agreement\.(kl_mean|top1)"
            r"|needle\.(recall_drop|truncation_rise)"
            r"|tasks\.accuracy_drop"
            r"|tasks\.\S+\.(drop|truncation_rise)"
            r"|load\.(throughput_drop|p99_latency_rise)"
            r"|load\.endpoint\.(throughput_drop|[a-z0-9]+_p[0-9]+_rise)"
            r"|load\.\S+\.(throughput_drop|[a-z0-9]+_p[0-9]+_rise))$")

ANY = "*"  # a CHECK_REQUIRES condition: the key is there and not null
# Per schema version, what every check must carry: (condition, fields); a condition (key, value) limits
# the rule to the checks whose key has that value. The model checks presence, as JSON Schema's
# `required` does: a field that is there may still be null where its type allows.
CHECK_REQUIRES: dict[str, list[tuple[tuple[str, Any] | None, tuple[str, ...]]]] = {
    "kvprobe.verdict/2": [(None, ("id",))],
    "kvprobe.verdict/3": [(None, ("id",)),
                          (("case", ANY), ("case_fields",)),
                          (("probe", "load"), ("dropped_client_limited", "client_limited_reason"))],
}


class VerdictModelError(RuntimeError):
    """kvprobe built a verdict its own model rejects: a bug in kvprobe, never a measured outcome."""


class _Open(BaseModel):
    # strict: a verdict is JSON that kvprobe wrote, so a number written as a string is wrong, not coerced
    model_config = ConfigDict(extra="allow", strict=True)


Outcome = Literal["pass", "fail", "inconclusive", "not_measured"]
DecisionKind = Literal["invalid", "broken", "reject", "no_gain", "inconclusive", "adopt"]
Probe = Literal[ORDER]  # type: ignore[valid-type]  # kvprobe.probes: the one list
Scalar = str | int | float | bool | None
# [lo, hi]; an end that is not finite is written as null
Interval = Annotated[list[float | None], Field(min_length=2, max_length=2)]
CaseFields = Annotated[dict[str, Scalar], Field(
    description="a case as typed fields: a load case's shape (or name), agents and, open loop, rate "
                "({\"shape\": \"default\", \"agents\": 1}); a task's {\"task\": name}")]


class Check(_Open):
    """One bar judged for one candidate (kvprobe.verdict.checks): its outcome, its words and its numbers."""

    id: str | None = Field(None, pattern=CHECK_ID, description=(
        "stable id, `<probe>.<what>` or `<probe>.<case>.<what>` (a case: a task's name, or a load case with dots "
        "for spaces); required from kvprobe.verdict/2 on"))
    bar: str = Field(description="the bar's name in servers.toml [bars]")
    metric: str
    probe: Probe
    case: str | None = Field(description="the load case (\"shape=default agents=1\") or task the check is on")
    value: float | None
    interval: Interval | None = Field(description="95% interval of value, in the bar's units")
    limit: float | None = Field(description="the bar the interval is judged against")
    outcome: Outcome
    text: str
    gating: bool = Field(True, description="false: a guardrail, which can reject but never holds adopt back")
    advisory: bool = Field(False, description="reported, never deciding (a canary's --advisory-speed)")
    power: dict[str, Any] | None = None
    ratio: float | None = None
    ratio_interval: Interval | None = None
    sequential: dict[str, Any] | None = Field(None, description="a speed endpoint's group-sequential test")
    state: Literal["decided", "open", "spent"] | None = None
    # kvprobe.verdict/3: fields beside the words that say the same
    case_fields: CaseFields | None = None
    scope_cases: list[CaseFields] | None = Field(None, description="the cases a speed endpoint averages over")
    dropped_client_limited: int | None = Field(None, ge=0, description=(
        "paired blocks left out because a client, not the server, set the pace"))
    client_limited_reason: str | None = Field(None, description="why the first of them was the client's")
    # rules/2 and /3: the case's client could have moved its numbers, so it was not judged (the reason)
    client_limited: str | bool | None = None


class CandidateDecision(_Open):
    decision: DecisionKind
    reasons: list[str] = Field(min_length=1, description="the first one is the decision's reason")
    checks: list[Check]
    kv_cache_tokens: int | None
    capacity_ratio: float | None
    capacity_gain: float | None = None


class Recommendation(_Open):
    server: str
    change: bool = Field(description="true: adopt a candidate; false: keep the reference")
    reason: str


class ServerRow(_Open):
    """A server as its inventory found it."""

    role: Literal["reference", "candidate"]
    status: str = Field(description="ok, not_inventoried, or why it could not serve")
    error: str | None = None
    version: str | None = None
    model: str | None = None
    cache_dtype: str | None = None
    max_model_len: int | None = None
    kv_cache_tokens: int | None = None
    kv_cache_tokens_estimate: bool | None = None
    max_concurrency: float | None = None
    smoke_ok: bool | None = None
    smoke_prompt_tokens: int | None = None


class Difference(_Open):
    field: str
    values: dict[str, Any]
    text: str


class Pin(_Open):
    """The one-knob check: what differs between each candidate and the reference besides the knob."""

    valid: bool
    knob: str | None = None
    by_candidate: dict[str, list[Difference]] = Field(default_factory=dict)
    differences: list[Difference] = Field(default_factory=list)
    unchecked: list[str] = Field(default_factory=list)
    knob_values: dict[str, Any] = Field(default_factory=dict)
    platforms: dict[str, dict[str, Any] | None] = Field(default_factory=dict)


class LeftOut(_Open):
    name: str
    reason: str


class Run(_Open):
    id: str
    started: str | None
    measured_by: str | None
    probes_requested: list[str] | None
    resumed: list[str]
    left_out: list[LeftOut]
    first_measurement: str | None
    last_measurement: str | None


class Bars(_Open):
    """The bars as the run fixed them (kvprobe.config.Bars); a verdict may name only some."""

    perplexity_delta_max: float | None = None
    needle_recall_drop_max: float | None = None
    truncation_rise_max: float | None = None
    capacity_gain_min: float | None = None
    throughput_drop_max: float | None = None
    p99_latency_rise_max: float | None = None
    kl_mean_max: float | None = None
    task_accuracy_drop_max: float | dict[str, float] | None = None
    top1_agreement_min: float | None = None


class LoadCase(_Open):
    """One load case on one server: its identity as fields, its figures, and whether its client set the pace."""

    shape: str | None = None
    name: str | None = None
    agents: int | None = None
    rate: float | None = None
    client_limited: bool | None = None
    client_limited_why: str | None = None
    repeats: list[dict[str, Any]] | None = None


class LoadServer(_Open):
    cases: list[LoadCase]


class LoadEvidence(_Open):
    servers: dict[str, LoadServer]
    design: dict[str, Any] | None = None
    stops: dict[str, Any] | None = None
    sizing: dict[str, Any] | None = None  # the pilot's figures and the case length and blocks it planned
    duty_cycle: float | None = None  # measured case time over the load probe's wall time


class CapacityEvidence(_Open):
    servers: dict[str, dict[str, Any]]
    explain: dict[str, str] | None = None
    lever: str | None = None


class Probes(_Open):
    """Each probe's recorded numbers (kvprobe.verdict.evidence); null: the probe did not run."""

    capacity: CapacityEvidence | None = None
    perplexity: dict[str, Any] | None = None
    agreement: dict[str, Any] | None = None
    needle: dict[str, Any] | None = None
    tasks: dict[str, Any] | None = None
    load: LoadEvidence | None = None
    fill: dict[str, Any] | None = None


def _condition_json(key: str, value: Any) -> dict[str, Any]:
    return {"properties": {key: {"not": {"type": "null"}} if value == ANY else {"const": value}}, "required": [key]}


def _requires_json() -> list[dict[str, Any]]:
    """CHECK_REQUIRES as JSON Schema: per version, an if/then over every check of every decision."""
    out = []
    for version, rules in CHECK_REQUIRES.items():
        each = [{"required": list(fields)} if when is None
                else {"if": _condition_json(*when), "then": {"required": list(fields)}} for when, fields in rules]
        checks = {"properties": {"checks": {"items": {"allOf": each}}}}
        out.append({"if": {"properties": {"schema": {"const": version}}, "required": ["schema"]},
                    "then": {"properties": {"decisions": {"additionalProperties": checks}}}})
    return out


class Verdict(_Open):
    """verdict.json: the recorded numbers, the bars fixed before the run, and the decisions they give."""

    model_config = ConfigDict(title="kvprobe verdict", json_schema_extra={
        "$schema": "https://json-schema.org/draft/2020-12/schema", "allOf": _requires_json()})

    schema_: SchemaVersion = Field(alias="schema")
    rules: RulesVersion
    kvprobe_version: str
    method: dict[str, Any]
    run: Run
    reference: str
    order: list[str]
    bars: Bars
    servers: dict[str, ServerRow]
    pin: Pin | None
    broken: dict[str, str] = Field(description="servers a probe found broken, with the first error")
    probes: Probes
    probes_status: dict[str, str]
    decisions: dict[str, CandidateDecision]
    recommendation: Recommendation
    exit_code: Literal[0, 1, 3, 4]

    @model_validator(mode="after")
    def _per_version(self) -> Verdict:
        for name, decision in self.decisions.items():
            for i, check in enumerate(decision.checks):
                for when, fields in CHECK_REQUIRES.get(self.schema_, []):
                    if when is not None and not _holds(check, *when):
                        continue
                    missing = [f for f in fields if f not in check.model_fields_set]
                    if missing:
                        raise ValueError(f"decisions.{name}.checks.{i}: no {', '.join(missing)} "
                                         f"({check.id or check.bar}; {self.schema_} requires it)")
        return self


def _holds(check: Check, key: str, value: Any) -> bool:
    got = getattr(check, key, None)
    return got is not None if value == ANY else got == value


def problems(data: bytes) -> list[str]:
    """Where verdict.json's bytes do not follow the model, one line each naming the field (empty: they do)."""
    try:
        Verdict.model_validate_json(data)
    except ValidationError as exc:
        out = []
        for error in exc.errors(include_url=False):
            where = ".".join(map(str, error["loc"]))
            message = error["msg"].removeprefix("Value error, ")
            if error["type"] == "string_pattern_mismatch" and error["loc"][-1:] == ("id",):
                message = f"{error['input']!r} is not a check id (the grammar: `id` in {SCHEMA_FILE.name})"
            out.append(f"{where}: {message}" if where else message)
        return out
    return []


def check_written(data: bytes) -> None:
    """Raise VerdictModelError when kvprobe's own verdict does not follow the model."""
    found = problems(data)
    if found:
        raise VerdictModelError("kvprobe built a verdict its schema rejects (a bug): " + "; ".join(found[:5]))


def json_schema() -> dict[str, Any]:
    return Verdict.model_json_schema(by_alias=True)


def schema_text() -> str:
    return json.dumps(json_schema(), indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Write the model's JSON Schema to schemas/verdict.schema.json (or the path given)."""
    args = sys.argv[1:] if argv is None else argv
    path = Path(args[0]) if args else SCHEMA_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(schema_text())
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
