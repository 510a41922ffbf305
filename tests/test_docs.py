"""The documentation stays true: the README's quickstart servers.toml parses as kvprobe parses it, every
relative link in README.md and docs/*.md points at a file that exists (and at a heading that exists, when
it names one), and the README keeps the two commands CI and a newcomer run."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from kvprobe.config import Config, parse_config

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))

FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```[ \t]*$", re.M | re.S)
LINK = re.compile(r"(?<!!)\[[^\]\n]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
HEADING = re.compile(r"^#{1,6}[ \t]+(.+?)[ \t]*#*[ \t]*$", re.M)


def _blocks(text: str, lang: str) -> list[str]:
    return [body for info, body in FENCE.findall(text) if info.strip().split(" ")[0] == lang]


def _section(text: str, heading: str) -> str:
    """The text under the first `## heading...` up to the next `## ` heading."""
    start = re.search(rf"^## {re.escape(heading)}.*$", text, re.M)
    assert start, f"README.md has no section '## {heading}'"
    end = re.search(r"^## ", text[start.end():], re.M)
    return text[start.end(): start.end() + end.start() if end else len(text)]


def _parse(text: str, monkeypatch: pytest.MonkeyPatch, source: str) -> Config:
    data = tomllib.loads(text)
    # The examples call api_key_env optional: they parse with the variables they name unset.
    for server in data.get("server", []):
        if server.get("api_key_env"):
            monkeypatch.delenv(server["api_key_env"], raising=False)
    return parse_config(data, source)


def test_quickstart_servers_toml_is_valid(monkeypatch: pytest.MonkeyPatch) -> None:
    quickstart = _section(README.read_text(), "Quickstart")
    blocks = _blocks(quickstart, "toml")
    assert len(blocks) == 1, "the quickstart shows exactly one servers.toml"
    text = blocks[0]
    lines = [line for line in text.splitlines() if line.strip()]
    assert len(lines) <= 12, f"the quickstart's servers.toml is {len(lines)} lines: keep it short"
    config = _parse(text, monkeypatch, "README.md quickstart")
    assert config.reference.name and config.candidates, "a reference and at least one candidate"


def test_kvprobe_check_passes_the_quickstart_servers_toml_with_its_optional_key_unset(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The quickstart calls api_key_env optional: `kvprobe check` on it, with the variable unset, exits 0 and warns
    once, naming the variable (a server without auth is fine; one that needs a key answers 401 naming it)."""
    from click.testing import CliRunner

    from kvprobe.cli import main

    text = _blocks(_section(README.read_text(), "Quickstart"), "toml")[0]
    assert re.search(r'^api_key_env = "KVPROBE_API_KEY" +# optional', text, re.M), "the README says it is optional"
    monkeypatch.delenv("KVPROBE_API_KEY", raising=False)
    path = tmp_path / "servers.toml"
    path.write_text(text)
    # wide: check wraps at the terminal's width, and pytest's temporary path alone can pass 120 columns
    result = CliRunner(env={"COLUMNS": "1000"}).invoke(main, ["check", str(path)])
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith(f"{path}: valid, with 1 warning(s)")
    assert result.stderr.splitlines() == [
        f"warning: {path}: server[0].api_key_env: KVPROBE_API_KEY is not set, so bf16 and fp8 are sent no API key: "
        "export it if they need one"]


def test_the_verdict_example_is_a_current_rules_run_as_kvprobe_show_prints_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """README section 5's example is the summary `kvprobe show` prints for the recorded run it names, at the width
    it names: a change to the summary, the run or the rules shows up here. The run is rules/4 or later (its
    single speed endpoint): rules/5 and /6 changed no figure a summary of that run shows."""
    import orjson
    from click.testing import CliRunner

    from kvprobe.cli import main
    from kvprobe.verdict.build import RULES, RULES_4

    section = _section(README.read_text(), "Quickstart")
    section = section[section.index("### 5. Read the verdict"):section.index("### 6.")]
    run = ROOT / re.search(r"`(tests/fixtures/runs/[\w.-]+)/`", section).group(1)
    columns = re.search(r"`COLUMNS=(\d+) kvprobe show`", section).group(1)
    assert orjson.loads((run / "verdict.json").read_bytes())["rules"] in (RULES_4, RULES)
    (example,) = [b for b in _blocks(section, "") if b.startswith("reference ")]
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))  # no allowed_signers of the user's decides the first line
    shown = CliRunner(env={"COLUMNS": columns}).invoke(main, ["show", str(run)])
    first, _, summary = shown.stdout.partition("\n")
    assert first.startswith(("signature verified", "NOT verified"))
    assert example == "".join(line.rstrip() + "\n" for line in summary.splitlines())


def test_full_servers_toml_examples_are_valid(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every whole servers.toml in docs/servers-toml.md (a block with a [[server]] table) parses."""
    blocks = [b for b in _blocks((ROOT / "docs" / "servers-toml.md").read_text(), "toml") if "[[server]]" in b]
    assert blocks, "docs/servers-toml.md shows the annotated servers.toml"
    for block in blocks:
        _parse(block, monkeypatch, "docs/servers-toml.md")


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: inline markup dropped, lower case, punctuation but - and _ removed,
    spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "")
    text = re.sub(r"[^\w\- ]", "", text.lower())
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text = FENCE.sub("", path.read_text())
    seen: dict[str, int] = {}
    out = set()
    for heading in HEADING.findall(text):
        slug = _slug(heading)
        n = seen.get(slug, 0)
        out.add(slug if n == 0 else f"{slug}-{n}")
        seen[slug] = n + 1
    return out


def _links(path: Path) -> list[str]:
    text = FENCE.sub("", path.read_text())
    text = re.sub(r"`[^`\n]*`", "", text)  # code spans are not links
    return LINK.findall(text)


@pytest.mark.parametrize("doc", [README, *DOCS], ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(doc: Path) -> None:
    broken = []
    for target in _links(doc):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        path_part, _, anchor = target.partition("#")
        dest = (doc.parent / path_part).resolve() if path_part else doc
        if not dest.exists():
            broken.append(f"{target}: {dest.relative_to(ROOT) if ROOT in dest.parents else dest} does not exist")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            broken.append(f"{target}: no heading with anchor #{anchor} in {dest.relative_to(ROOT)}")
    assert not broken, f"{doc.relative_to(ROOT)}: broken links:\n" + "\n".join(broken)


def test_docs_pages_are_linked_from_the_readme() -> None:
    linked = {(ROOT / t.partition("#")[0]).resolve() for t in _links(README) if not t.startswith("http")}
    missing = [str(p.relative_to(ROOT)) for p in DOCS if p.resolve() not in linked]
    assert not missing, f"docs pages the README does not link: {missing}"


def test_readme_keeps_the_two_commands() -> None:
    text = README.read_text()
    assert re.search(r"^## The two commands\s*$", text, re.M), "README.md keeps '## The two commands'"
    bash = _blocks(text, "bash")
    commands = [[line.split("#")[0].strip() for line in b.splitlines() if line.strip()] for b in bash]
    assert any(c[:2] == ["scripts/demo", "scripts/test"] for c in commands), (
        "README.md has a bash block whose commands are `scripts/demo` then `scripts/test`")
    assert re.search(r"^scripts/test\b", text, re.M), "CI reads the README's test command: scripts/test"


def test_readme_keeps_a_layout_section() -> None:
    assert re.search(r"^## Layout\s*$", README.read_text(), re.M)


def test_the_layout_names_every_module() -> None:
    """docs/layout.md lists every module (by file name, or its package's line for the engines)."""
    text = (ROOT / "docs" / "layout.md").read_text()
    described_by_package = ("memmap", "quality", "needle", "load", "report", "cli")
    missing = []
    for path in sorted((ROOT / "kvprobe").rglob("*.py")):
        rel = path.relative_to(ROOT / "kvprobe")
        if rel.name in ("__init__.py", "__main__.py") or rel.parts[0] in described_by_package or \
                rel.parts[:2] in (("verdict", "checks"), ("verdict", "sealed")):  # sealed: copies, its line says so
            continue
        if rel.name not in text:
            missing.append(str(rel))
    assert missing == [], f"docs/layout.md does not name: {missing}"
