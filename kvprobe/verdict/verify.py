"""`kvprobe verify`: the signature holds, and the decisions follow from the recorded numbers.

Four checks, each failing with one line that says what is wrong:
1. verdict.json.sig is a valid SSHSIG over the exact bytes of verdict.json, in the kvprobe-verdict
   namespace, by a key the allowed_signers file lists;
2. verdict.json follows its own schema version (kvprobe.verdict.schema; the first field that does not
   is named), so a consumer reading the published schema reads what was signed;
3. the decisions, recommendation and exit code re-derived from the verdict's own numbers and bars
   equal the recorded ones;
4. when the run directory is there, the verdict's numbers equal what its probe files say.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from kvprobe.errors import ConfigError, SchemaViolation, SignatureError
from kvprobe.run.store import RunDir
from kvprobe.verdict.build import INPUT_KEYS, RULES, rederive, same
from kvprobe.verdict.evidence import gather
from kvprobe.verdict.schema import problems
from kvprobe.verdict.sign import Signer, load_allowed_signers, verify


@dataclass
class Verified:
    path: Path
    verdict: dict[str, Any]
    signer: Signer
    allowed_source: str
    notes: list[str] = field(default_factory=list)


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


def verify_verdict(target: str | Path, allowed_signers: str | Path | None = None,
                   principal: str | None = None) -> Verified:
    path = locate(target)
    sig_path = path.with_name(path.name + ".sig")
    if not sig_path.is_file():
        raise SignatureError(f"{sig_path}: no signature: the verdict is unsigned")
    allowed, source = load_allowed_signers(allowed_signers)
    data = path.read_bytes()
    signer = verify(data, sig_path.read_text(errors="replace"), allowed, principal=principal,
                    allowed_source=source)
    try:
        verdict = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise SignatureError(f"{path}: signed, but not JSON: {exc}") from None
    violations = problems(data)
    if violations:
        more = f" (and {len(violations) - 1} more)" if len(violations) > 1 else ""
        schema = verdict.get("schema") if isinstance(verdict, dict) else None
        raise SchemaViolation(f"{path}: does not follow its schema {schema!r}: {violations[0]}{more}")
    differ = rederive(verdict)
    if differ:
        raise SignatureError(f"{path}: the decisions do not follow from the recorded numbers: " + "; ".join(differ))
    result = Verified(path, verdict, signer, source)
    drift = check_against_run(path, verdict)
    if drift:
        shown = ", ".join(drift[:5]) + (f" and {len(drift) - 5} more" if len(drift) > 5 else "")
        raise SignatureError(f"{path}: the verdict's numbers differ from the run directory's files at {shown}")
    if not (path.parent / "run.json").is_file():
        result.notes.append("no run directory beside the verdict: its numbers were not compared with the probe files")
    elif verdict.get("rules") != RULES:
        result.notes.append(f"written under {verdict.get('rules')}: re-derived under those rules; of its numbers, "
                            "those this kvprobe still reads from the probe files were compared with them")
    return result
