"""`kvprobe verify`: the signature holds, and the decisions follow from the recorded numbers.

Four checks, each failing with one line that says what is wrong:
1. verdict.json.sig is a valid SSHSIG over the exact bytes of verdict.json, in the kvprobe-verdict
   namespace, by a key the allowed_signers file lists;
2. verdict.json follows its own schema version (kvprobe.verdict.schema; the first field that does not
   is named), so a consumer reading the published schema reads what was signed;
3. the decisions, recommendation and exit code re-derived from the verdict's own numbers and bars
   equal the recorded ones;
4. when the run directory is there, the verdict's numbers equal what its probe files say.
`verify_verdict` stops at the first that fails; `examine` runs them all and keeps every reason (verify --json,
report and show say them all).
"""

from __future__ import annotations

from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from kvprobe.errors import EXIT_OK, ConfigError, KvprobeError, SchemaViolation, SignatureError, one_line
from kvprobe.run.store import RunDir
from kvprobe.verdict.build import INPUT_KEYS, RULES, rederive, same
from kvprobe.verdict.evidence import gather
from kvprobe.verdict.schema import problems
from kvprobe.verdict.sign import Signer, load_allowed_signers, parse_signature, verify


@dataclass
class Verified:
    path: Path
    verdict: dict[str, Any]
    signer: Signer
    allowed_source: str
    notes: list[str] = field(default_factory=list)


@dataclass
class Examined:
    """Everything `verify` found, holding or not: `verify --json`, `report` and `show` say why a verdict does
    not hold instead of stopping at the first reason, as `verify_verdict` does."""

    path: Path
    signature_required: bool = True  # False: `--unsigned`, the signature is reported, not required
    verdict: dict[str, Any] | None = None  # as read: evidence only when `holds`
    signed_by: str | None = None  # the fingerprint verdict.json.sig names, trusted or not
    signer: Signer | None = None  # set when the allowed_signers file allows that key
    allowed_source: str | None = None
    signature_problem: KvprobeError | None = None
    problems: list[KvprobeError] = field(default_factory=list)  # the rest, in the order verify checks
    notes: list[str] = field(default_factory=list)

    @property
    def failures(self) -> list[KvprobeError]:
        if self.signature_problem is None or not self.signature_required:
            return self.problems
        return [self.signature_problem, *self.problems]

    @property
    def holds(self) -> bool:
        return not self.failures

    @property
    def exit_code(self) -> int:
        """verify's: 0 holds, else the first failure's (1 does not hold, 2 cannot check)."""
        return self.failures[0].exit_code if self.failures else EXIT_OK

    @property
    def reasons(self) -> list[str]:
        return [one_line(exc, limit=1000) for exc in self.failures]


def locate(target: str | Path) -> Path:
    """DIR or DIR/verdict.json -> the verdict file."""
    path = Path(target)
    if path.is_dir():
        path = path / "verdict.json"
    if not path.is_file():
        raise ConfigError([f"{target}: no verdict.json there: run `kvprobe eval` first, or give the verdict file"])
    return path


def _differences(recorded: Any, current: Any, where: str, shared_only: bool = False) -> list[str]:
    if isinstance(recorded, dict) and isinstance(current, dict):
        out = []
        keys = set(recorded) & set(current) if shared_only else set(recorded) | set(current)
        for key in sorted(keys, key=str):
            out += _differences(recorded.get(key), current.get(key), f"{where}.{key}" if where else str(key),
                                shared_only)
        return out
    return [] if same(recorded, current) else [where]


def check_against_run(path: Path, verdict: dict[str, Any]) -> list[str]:
    """Where the verdict's numbers differ from the run directory beside it (empty: they agree). A verdict
    of older rules recorded its evidence in an older form: what both forms carry is compared."""
    run_dir = path.parent
    if not (run_dir / "run.json").is_file():
        return []
    current = gather(RunDir.open(run_dir))
    recorded = {k: verdict.get(k) for k in INPUT_KEYS}
    return _differences(recorded, current, "", shared_only=verdict.get("rules") != RULES)


def _signature(found: Examined, data: bytes, allowed_signers: str | Path | None, principal: str | None) -> None:
    """Who signed verdict.json, and whether the allowed_signers file trusts them (found.signature_problem if not)."""
    sig_path = found.path.with_name(found.path.name + ".sig")
    if not sig_path.is_file():
        found.signature_problem = SignatureError(f"{sig_path}: no signature: the verdict is unsigned")
        return
    armored = sig_path.read_text(errors="replace")
    with suppress(SignatureError):  # verify() says why, after the allowed_signers file: verify's order
        found.signed_by = parse_signature(armored).fingerprint
    try:
        allowed, found.allowed_source = load_allowed_signers(allowed_signers)
        found.signer = verify(data, armored, allowed, principal=principal, allowed_source=found.allowed_source)
    except KvprobeError as exc:  # SignatureError, or ConfigError: no allowed_signers file to check against
        found.signature_problem = exc


def _contents(found: Examined, data: bytes) -> None:
    """Schema, then the decisions re-derived, then the numbers against the run directory (each needs the one
    before: a verdict off its schema cannot be decided again)."""
    path = found.path
    try:
        verdict = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        found.problems.append(SignatureError(f"{path}: not JSON: {exc}"))
        return
    found.verdict = verdict if isinstance(verdict, dict) else None
    violations = problems(data)
    if violations:
        more = f" (and {len(violations) - 1} more)" if len(violations) > 1 else ""
        schema = verdict.get("schema") if isinstance(verdict, dict) else None
        found.problems.append(SchemaViolation(f"{path}: does not follow its schema {schema!r}: {violations[0]}{more}"))
        return
    differ = rederive(verdict)
    if differ:
        found.problems.append(SignatureError(f"{path}: the decisions do not follow from the recorded numbers: "
                                             + "; ".join(differ)))
        return
    drift = check_against_run(path, verdict)
    if drift:
        shown = ", ".join(drift[:5]) + (f" and {len(drift) - 5} more" if len(drift) > 5 else "")
        found.problems.append(SignatureError(f"{path}: the verdict's numbers differ from the run directory's "
                                             f"files at {shown}"))
    elif not (path.parent / "run.json").is_file():
        found.notes.append("no run directory beside the verdict: its numbers were not compared with the probe files")
    elif verdict.get("rules") != RULES:
        found.notes.append(f"written under {verdict.get('rules')}: re-derived under those rules; of its numbers, "
                           "those this kvprobe still reads from the probe files were compared with them")


def examine(target: str | Path, allowed_signers: str | Path | None = None, principal: str | None = None,
            unsigned: bool = False) -> Examined:
    """Every check `verify` makes, run to the end (never raises for a verdict that does not hold). With
    `unsigned`, a signature that is missing or does not hold is reported but does not count against it."""
    try:
        path = locate(target)
    except ConfigError as exc:
        return Examined(Path(target), signature_required=not unsigned, problems=[exc])
    found = Examined(path, signature_required=not unsigned)
    data = path.read_bytes()
    _signature(found, data, allowed_signers, principal)
    _contents(found, data)
    return found


def verify_verdict(target: str | Path, allowed_signers: str | Path | None = None,
                   principal: str | None = None) -> Verified:
    """The verdict, when it holds; else its first failure raised (SignatureError, SchemaViolation, ConfigError)."""
    found = examine(target, allowed_signers, principal)
    if found.failures:
        raise found.failures[0]
    assert found.verdict is not None and found.signer is not None and found.allowed_source is not None
    return Verified(found.path, found.verdict, found.signer, found.allowed_source, found.notes)
