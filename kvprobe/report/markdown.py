"""DIR/report.md: the verdict for a pull request or a ticket (tables, plots as files beside it)."""

from __future__ import annotations

from typing import Any

from kvprobe.report.standing import NOT_VERIFIED, Standing
from kvprobe.report.summary import kept_but_broke
from kvprobe.report.tables import TableData, all_tables


def cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def table(t: TableData) -> str:
    lines = [f"### {t.title}", "", "| " + " | ".join(cell(h) for h in t.headers) + " |",
             "|" + "|".join("---" for _ in t.headers) + "|"]
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in t.rows]
    if t.note:
        lines += ["", t.note]
    return "\n".join(lines)


def _signature(standing: Standing) -> list[str]:
    """The Signature section: who the signature names and how to check it with the standard tool; a verdict that
    did not verify is never called signed."""
    sig = standing.signature
    if sig is None:
        return ["## Signature", "", "Not signed.", ""]
    named = f"(SSHSIG, namespace `{sig['namespace']}`) by `{sig['fingerprint']}`"
    head = (f"{standing.line}. verdict.json.sig names a key {named}: that alone proves nothing."
            if standing.kind == NOT_VERIFIED else f"Signed {named}.")
    return ["## Signature", "", head, "",
            "Verify with the standard tool. The allowed_signers line is whom you trust: build it from a "
            "key you know, or check that the fingerprint above is the one you expect.", "",
            "```sh",
            f"echo 'kvprobe-signer namespaces=\"{sig['namespace']}\" {sig['public_line']}' > allowed_signers",
            f"ssh-keygen -Y verify -f allowed_signers -I kvprobe-signer -n {sig['namespace']} "
            "-s verdict.json.sig < verdict.json",
            "kvprobe verify . --allowed-signers allowed_signers   # also re-derives every decision",
            "```", ""]


def render(v: dict[str, Any], plots: list[tuple[str, str | None, str]], standing: Standing) -> str:
    """`plots`: (title, path relative to the report or None, why it is absent). `standing` is the first line."""
    rec = v["recommendation"]
    out = [f"# kvprobe verdict: {v['run']['id']}", "", f"**{standing.line}**", "",
           f"**Recommendation: {rec['server']}** — {rec['reason']}", "",
           *([f"**{caveat}** ({v['broken'][rec['server']]})", ""] if (caveat := kept_but_broke(v)) else []),
           f"Measured {v['run'].get('first_measurement') or '-'} to {v['run'].get('last_measurement') or '-'} "
           f"by kvprobe {v['run'].get('measured_by') or '-'}; verdict schema {v['schema']}, rules {v['rules']}.", ""]
    tables = all_tables(v)
    for t in tables:
        if t.title == "Every check":
            continue
        out += [table(t), ""]
    out += ["## Plots", ""]
    for title, path, absent in plots:
        out += [f"![{title}]({path})" if path else f"*{title}: {absent}*", ""]
    checks = next(t for t in tables if t.title == "Every check")
    out += ["## Checks", "", table(checks), ""]
    return "\n".join(out + _signature(standing))
