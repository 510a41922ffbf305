"""What every report says first: whether the verdict it shows can be trusted. `report` and `show`
check it as `verify` does (kvprobe.verdict.verify.examine); `eval` signed what it had just derived; a run that did not
finish has no signed verdict at all. A decision that does not follow from its own checks is never shown as
signed: the reasons it does not hold are the first line."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvprobe.errors import SignatureError
from kvprobe.run.store import RunDir
from kvprobe.verdict.sign import parse_signature
from kvprobe.verdict.verify import Examined

VERIFIED, SIGNED_HERE, NOT_VERIFIED = "verified", "signed here", "not verified"


@dataclass(frozen=True)
class Standing:
    kind: str  # VERIFIED, SIGNED_HERE or NOT_VERIFIED
    line: str  # one line: "signature verified: ...", "signed by ... in this run" or "NOT verified: <why>"
    short: str  # a few words for the line that names verdict.json
    signature: dict[str, Any] | None = None  # what verdict.json.sig names (signature_info): not a trust check


def signature_info(run: RunDir) -> dict[str, Any] | None:
    """Who signed verdict.json (fingerprint and public key from the signature; not a trust check)."""
    sig = run.path / "verdict.json.sig"
    if not sig.is_file():
        return None
    try:
        parsed = parse_signature(sig.read_text(errors="replace"))
    except SignatureError as exc:
        return {"fingerprint": f"unreadable signature: {exc}", "namespace": "-", "public_line": "-"}
    return {"fingerprint": parsed.fingerprint, "namespace": parsed.namespace, "public_line": parsed.public_line}


def checked(run: RunDir, found: Examined) -> Standing:
    """The verdict as `verify` found it: verified only when the signature holds against an allowed_signers file
    and every decision re-derives."""
    signature = signature_info(run)
    if found.holds and found.signer is not None:
        signer = found.signer
        return Standing(VERIFIED, f"signature verified: signed by {signer.fingerprint} ({', '.join(signer.principals)} "
                                  f"in {found.allowed_source}); every decision re-derived from the recorded numbers",
                        "signature verified", signature)
    return Standing(NOT_VERIFIED, "NOT verified: " + "; ".join(found.reasons), "NOT verified", signature)


def this_run(run: RunDir) -> Standing:
    """eval's: it derived the decisions and signed them just now; whether the key is trusted is the reader's
    allowed_signers file's to say (kvprobe verify)."""
    signature = signature_info(run)
    if signature is None:
        return Standing(NOT_VERIFIED, "NOT verified: not signed", "not signed")
    fingerprint = signature["fingerprint"]
    return Standing(SIGNED_HERE, f"signed by {fingerprint} in this run; `kvprobe verify` checks it against an "
                                 "allowed_signers file", f"signed by {fingerprint}", signature)


def unfinished() -> Standing:
    return Standing(NOT_VERIFIED, "NOT verified: no verdict.json (the run did not finish): decided from what is on "
                                  "disk, unsigned", "NOT verified")
