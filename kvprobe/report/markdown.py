"""DIR/report.md: the verdict for a pull request or a ticket (tables, plots as files beside it)."""

from __future__ import annotations

from typing import Any

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


def render(v: dict[str, Any], plots: list[tuple[str, str | None, str]], signature: dict[str, Any] | None) -> str:
    """`plots`: (title, path relative to the report or None, why it is absent)."""
    rec = v["recommendation"]
    out = [f"# kvprobe verdict: {v['run']['id']}", "",
           f"**Recommendation: {rec['server']}** — {rec['reason']}", "",
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
    out += ["## Signature", ""]
    if signature:
        out += [f"Signed (SSHSIG, namespace `{signature['namespace']}`) by `{signature['fingerprint']}`.", "",
                "Verify with the standard tool. The allowed_signers line is whom you trust: build it from a "
                "key you know, or check that the fingerprint above is the one you expect.", "",
                "```sh",
                f"echo 'kvprobe-signer namespaces=\"{signature['namespace']}\" {signature['public_line']}' "
                "> allowed_signers",
                f"ssh-keygen -Y verify -f allowed_signers -I kvprobe-signer -n {signature['namespace']} "
                "-s verdict.json.sig < verdict.json",
                "kvprobe verify . --allowed-signers allowed_signers   # also re-derives every decision",
                "```", ""]
    else:
        out += ["Not signed.", ""]
    return "\n".join(out)
