"""Per-server counts, the discordant cases, the heatmaps and the terminal table."""

from __future__ import annotations

import io

from rich.console import Console

from kvprobe.config import Bars
from kvprobe.needle.summary import paired, server_summary
from kvprobe.report.heatmap import paired_heatmap, paired_kind, status_heatmap
from kvprobe.report.summary import print_probe
from kvprobe.stats import mcnemar_p
from kvprobe.verdict.checks import live_checks

PNG = b"\x89PNG\r\n\x1a\n"


def _rows(statuses: str) -> dict[str, dict]:
    """'hhmt' -> {"n00": {"status": "hit"}, ...}"""
    names = {"h": "hit", "m": "miss", "t": "truncated", "e": "error"}
    return {f"n{i:02d}": {"id": f"n{i:02d}", "status": names[s]} for i, s in enumerate(statuses)}


def test_recall_leaves_out_truncated_and_errors() -> None:
    s = server_summary(_rows("hhmmmmtte").values())
    assert (s["hit"], s["miss"], s["truncated"], s["error"], s["cases"]) == (2, 4, 2, 1, 9)
    assert s["recall"] == 2 / 6
    assert s["truncation_rate"] == 2 / 8
    nothing = server_summary(_rows("tte").values())
    assert nothing["recall"] is None


def test_paired_lists_the_discordant_cases_and_judges_nothing() -> None:
    # the shape measured by hand on int8_per_token_head: 2 hit, 14 miss, 4 truncated
    ref = _rows("h" * 20)
    cand = _rows("hh" + "m" * 14 + "tttt")
    out = paired(ref, cand)
    assert out["reference_hit_candidate_miss"] == [f"n{i:02d}" for i in range(2, 16)]
    assert out["reference_hit_candidate_truncated"] == ["n16", "n17", "n18", "n19"]
    assert out["pairs"] == 20 and out["mcnemar_p"] < 0.001
    assert not {"outcome", "recall_drop", "bar"} & set(out)  # the checks judge (kvprobe.verdict.checks.answers)


def test_gains_are_listed_apart_from_losses() -> None:
    out = paired(_rows("hmhm"), _rows("mhhm"))
    assert out["reference_hit_candidate_miss"] == ["n00"]
    assert out["reference_miss_candidate_hit"] == ["n01"]
    assert out["mcnemar_p"] == 1.0


def test_mcnemar_p_is_exact() -> None:
    assert mcnemar_p(0, 0) == 1.0
    assert mcnemar_p(5, 0) == 2 / 32
    assert mcnemar_p(3, 3) == 1.0


def _cases() -> list[dict]:
    out = []
    for i, (length, depth) in enumerate((n, d) for n in (1024, 4096) for d in (0.0, 0.5, 1.0)):
        for server, status in (("auto", "hit"), ("int8", ["hit", "miss", "truncated", "error", "miss", "hit"][i])):
            out.append({"id": f"n{i:02d}", "server": server, "status": status, "target_length": length,
                        "target_depth": depth})
    return out


def test_heatmaps_are_png_files(tmp_path) -> None:
    cases = _cases()
    for path in (status_heatmap(cases, "int8", tmp_path / "a" / "int8.png"),
                 paired_heatmap(cases, "auto", "int8", tmp_path / "p.png")):
        data = path.read_bytes()
        assert data.startswith(PNG) and len(data) > 5000


def test_heatmap_with_several_cases_per_cell(tmp_path) -> None:
    cases = _cases() + [{**c, "id": c["id"] + "b", "status": "hit"} for c in _cases()]
    assert status_heatmap(cases, "int8", tmp_path / "x.png").read_bytes().startswith(PNG)


def test_paired_kinds() -> None:
    assert paired_kind("hit", "miss") == "lost"
    assert paired_kind("hit", "truncated") == "lost_truncated"
    assert paired_kind("miss", "hit") == "gained"
    assert paired_kind("truncated", "miss") == "both_not_hit"
    assert paired_kind("hit", "error") == "error"
    assert paired_kind("hit", "hit") == "both_hit"


def test_the_line_a_needle_run_ends_with_shows_both_checks() -> None:
    ref, cand = _rows("h" * 20), _rows("hh" + "m" * 14 + "tttt")
    cases = [{**c, "server": "auto"} for c in ref.values()] + \
        [{**c, "server": "int8_per_token_head"} for c in cand.values()]
    summary = {
        "reference": "auto",
        "servers": {"auto": server_summary(ref.values()), "int8_per_token_head": server_summary(cand.values())},
        "paired": {"int8_per_token_head": paired(ref, cand)},
        "cases": cases,
        "settings": {"max_tokens": 1024},
    }
    bars = Bars(needle_recall_drop_max=0.0)
    checks = live_checks("needle", summary, "auto", list(summary["servers"]), bars)
    buf = io.StringIO()
    print_probe(Console(file=buf, width=80, color_system=None), "needle", checks)
    text = " ".join(buf.getvalue().split())  # wrapped at 80 columns, between figures
    assert text.startswith("needle: int8_per_token_head ")
    recall, cut = checks["int8_per_token_head"]
    # the checks' own numbers: 18 of 20 lost (4 cut at the cap, scored as misses), and 4 of 20 cut
    assert recall["lost"] == 18 and f"{recall['value']:+.3f}" in text and recall["outcome"] == "fail"
    assert f"{cut['value']:+.3f}" in text and f"{cut['outcome']}" in text
