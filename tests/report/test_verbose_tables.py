"""`--verbose` tables never cut a figure: `kvprobe show DIR -v` of every recorded run (tests/fixtures/runs/*) at
COLUMNS=80, 100 and 120 is read back column by column, and every number, percentage, version and interval of
every cell is whole on one line of its cell; every cell's words are all there, in order; nothing is wider
than the terminal. Free text that goes under a table is read back the same way."""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner
from recorded import RUNS

from kvprobe.cli import main
from kvprobe.errors import EXIT_BAR_FAILED, EXIT_CANNOT_RUN, most_serious
from kvprobe.report.tables import TableData, all_tables
from kvprobe.report.text_table import render

RUN_DIRS = sorted(p for p in RUNS.iterdir() if (p / "verdict.json").is_file())
WIDTHS = (80, 100, 120)
# What must stay whole: an interval, or a number (with its sign, separators, decimals, a version's dots, a
# unit). Not a digit inside a word: int8_per_token_head and sm_90 are names.
FIGURE = re.compile(r"\[[^\[\]]*\]|(?<![\w.])[-+]?\d[\d,.]*[%xs]?")
TERMINAL_ONLY = ("Every check", "Bars (fixed before the run)")  # in report.md and report.html, not in -v


def figures(lines: list[str]) -> Counter[str]:
    return Counter(m.group() for line in lines for m in FIGURE.finditer(line))


def words(texts: list[str]) -> list[str]:
    return " ".join(texts).split()


@dataclass
class Part:
    """One drawn table: its title, each column's header and lines (by the rule under it), and what comes under."""

    title: str
    columns: list[tuple[str, list[str]]] = field(default_factory=list)  # (header, its lines), left to right
    lines: list[str] = field(default_factory=list)
    under: list[str] = field(default_factory=list)


def read_back(lines: list[str], titles: set[str]) -> list[Part]:
    parts = []
    for i, line in enumerate(lines):
        if "─" not in line or set(line) - {"─", " "}:
            continue
        top = i - 1
        while lines[top] not in titles:
            top -= 1
        end = lines.index("", i)
        part = Part(lines[top], lines=lines[top:end])
        header, body = lines[top + 1:i], lines[i + 1:end]
        spans = [m.span() for m in re.finditer("─+", line)]
        for a, b in spans:
            name = " ".join(words([h[a:b] for h in header]))
            part.columns.append((name, [row[a:b].rstrip() for row in body]))
        for row in header + body:  # nothing spills out of its column into the gap
            outside = "".join(ch for j, ch in enumerate(row) if not any(a <= j < b for a, b in spans))
            assert not outside.strip(), (part.title, row)
        if end + 1 < len(lines) and lines[end + 1] not in titles and lines[end + 1]:
            part.under = lines[end + 1:next((j for j in range(end + 1, len(lines)) if not lines[j]), len(lines))]
        parts.append(part)
    return parts


def entries(under: list[str], header: str) -> list[list[str]]:
    """The free-text column `header` under its table: its entries (`  KEY: text` and the lines wrapped under it)."""
    start = under.index(header) + 1
    out: list[list[str]] = []
    for line in under[start:]:
        if line.startswith("      ") and out:
            out[-1].append(line)
        elif line.startswith("  ") and line[2] != " ":
            out.append([line])
        else:
            break
    return out


def columns_of(t: TableData, parts: list[Part]) -> list[dict[int, list[str]]]:
    """Each part's columns by their index in `t`, matched left to right (a header may repeat: `outcome`), the
    row's key columns heading every part and the other columns continuing where the last part stopped."""
    drawn = []
    at = t.keys
    for part in parts:
        out: dict[int, list[str]] = {}
        for n, (name, lines) in enumerate(part.columns):
            if n < t.keys:
                assert name == " ".join(t.headers[n].split()), (t.title, name)
                out[n] = lines
                continue
            at = next(i for i in range(at, len(t.headers)) if " ".join(t.headers[i].split()) == name)
            out[at] = lines
            at += 1
        drawn.append(out)
    return drawn


def check_table(t: TableData, parts: list[Part], width: int) -> None:
    assert parts, f"{t.title}: not shown"
    under = parts[-1].under if t.prose or t.note else []  # else what follows is the next thing printed
    for part in parts:
        assert all(len(line) <= width for line in part.lines + under), (t.title, max(part.lines + under, key=len))
    drawn = columns_of(t, parts)
    for i, header in enumerate(t.headers):
        cells = [row[i] for row in t.rows]
        shown = [columns[i] for columns in drawn if i in columns]
        for lines in shown:
            assert words(lines) == words(cells), (t.title, header, lines)
            assert figures(lines) == figures(cells), (t.title, header, "a figure is split", lines)
        if shown:
            continue
        # not a column: a free-text column under the table, one entry per row that says something
        assert header in t.prose, f"{t.title}: column {header!r} is neither shown nor under the table"
        got = [" ".join(words(e)) for e in entries(under, header)]
        for row in t.rows:
            text, key = " ".join(row[i].split()), " · ".join(row[:t.keys])
            if text == "-":
                continue
            assert any(e.endswith(f": {text}") and key in (e[:-len(text) - 2].split(", ") if t.keys == 1
                                                            else [e[:-len(text) - 2]]) for e in got), (t.title, key)
        for entry in entries(under, header):
            assert figures(entry) == figures([" ".join(words(entry))]), (t.title, header, "a figure is split", entry)
    if t.note:
        note = [line for line in under if line and not line.startswith("  ") and line not in t.headers]
        assert " ".join(words(note)) == " ".join(t.note.split()), (t.title, note)
        assert figures(note) == figures([t.note]), (t.title, "a figure in the note is split")


@pytest.fixture(autouse=True)
def _own_config_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.delenv("KVPROBE_ALLOWED_SIGNERS", raising=False)


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("run", RUN_DIRS, ids=[p.name for p in RUN_DIRS])
def test_verbose_tables_never_split_a_figure(run: Path, width: int) -> None:
    verdict = orjson.loads((run / "verdict.json").read_bytes())
    result = CliRunner(env={"COLUMNS": str(width)}).invoke(main, ["show", str(run), "-v"])
    # never 0: unsigned (1), or signed with no allowed_signers here (2); the verdict's own code where it is more
    # serious (4: a server broke)
    unverified = EXIT_CANNOT_RUN if (run / "verdict.json.sig").exists() else EXIT_BAR_FAILED
    assert result.exit_code == most_serious(verdict["exit_code"], unverified), result.output
    tables = [t for t in all_tables(verdict) if t.title not in TERMINAL_ONLY]
    titles = {t.title for t in tables} | {f"{t.title} (continued)" for t in tables}
    parts = read_back(result.stdout.splitlines(), titles)
    assert {p.title.removesuffix(" (continued)") for p in parts} == {t.title for t in tables}
    for t in tables:
        check_table(t, [p for p in parts if p.title.removesuffix(" (continued)") == t.title], width)


def test_the_issues_splits_are_whole() -> None:
    """The figures issue #32 saw cut (`1,048,57` / `6`, `580.159.` / `04`) at 80 columns on the H200 run."""
    verdict = orjson.loads((RUNS / "h200-gpu" / "verdict.json").read_bytes())
    text = "\n".join(line.plain for t in all_tables(verdict) for line in render(t, 80))
    assert "1,048,576" in text and "580.159.04" in text
    assert not re.search(r"1,048,57\s*$", text, re.M) and not re.search(r"580\.159\.\s*$", text, re.M)


def test_a_table_too_wide_continues_under_itself_repeating_its_keys() -> None:
    t = TableData("T", ["candidate", "case", *(f"metric {i}" for i in range(6))], keys=2,
                  rows=[["fp8", "agents=1", *(f"1.0{i}x [0.9{i}, 1.1{i}] pass" for i in range(6))]])
    lines = [line.plain for line in render(t, 80)]
    assert lines[0] == "T" and "T (continued)" in lines
    assert sum(1 for line in lines if re.match(r"fp8 +agents=1 ", line)) == 2  # the keys head both halves
    assert all(len(line) <= 80 for line in lines)
    assert sum(line.count("[") for line in lines) == 6 and all(line.count("[") == line.count("]") for line in lines)


def test_free_text_goes_under_the_table_one_entry_per_distinct_text() -> None:
    reason = "not shown to pass: throughput drop ratio 0.870 [0.614, 1.234] over 3+3 runs, drop +12.97% " * 2
    t = TableData("Decisions", ["server", "KV tokens", "decision", "why"], prose=("why",),
                  rows=[["auto", "524,288", "reference", "the gold standard"],
                        ["fp8", "1,048,576", "inconclusive", reason], ["int8", "986,880", "inconclusive", reason]])
    # 60 columns leave 27 for it: a column of a few words a line goes under the table
    lines = [line.plain for line in render(t, 60)]
    assert lines[:3] == ["Decisions", "server  KV tokens  decision", "──────  ─────────  ────────────"]
    assert lines[lines.index("why") + 1] == "  auto: the gold standard"
    assert lines[lines.index("why") + 2].startswith("  fp8, int8: not shown to pass")
    assert all(len(line) <= 60 for line in lines)
    # at 80 it has 47 columns: it stays a column, wrapped between words
    narrow = [line.plain for line in render(t, 80)]
    assert "why" not in narrow and narrow[1].endswith("why") and all(len(line) <= 80 for line in narrow)
    assert any("[0.614, 1.234]" in line for line in narrow)
