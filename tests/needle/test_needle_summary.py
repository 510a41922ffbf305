"""Per-server counts, the paired comparison against the bar, the heatmaps and the terminal table."""

from __future__ import annotations

import io

from rich.console import Console

from kvprobe.needle.summary import mcnemar_exact, paired, server_summary
from kvprobe.report.heatmap import paired_heatmap, paired_kind, status_heatmap
from kvprobe.report.terminal import needle_table

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


def test_identical_servers_pass_a_zero_bar() -> None:
    ref = _rows("h" * 20)
    out = paired(ref, _rows("h" * 20), bar=0.0)
    assert out["reference_hit_candidate_miss"] == [] and out["reference_miss_candidate_hit"] == []
    assert out["recall_drop"] == {"estimate": 0.0, "lo": 0.0, "hi": 0.0}
    assert out["outcome"] == "pass" and out["mcnemar_p"] == 1.0


def test_collapsed_candidate_fails_and_says_which_cases() -> None:
    # the shape measured by hand on int8_per_token_head: 2 hit, 14 miss, 4 truncated
    ref = _rows("h" * 20)
    cand = _rows("hh" + "m" * 14 + "tttt")
    out = paired(ref, cand, bar=0.0)
    assert out["reference_hit_candidate_miss"] == [f"n{i:02d}" for i in range(2, 16)]
    assert out["reference_hit_candidate_truncated"] == ["n16", "n17", "n18", "n19"]
    assert out["decided"] == 16
    assert out["recall_drop"]["estimate"] == 14 / 16
    assert out["recall_drop"]["lo"] > 0.5
    assert out["outcome"] == "fail"
    assert out["mcnemar_p"] < 0.001
    assert out["truncation_rise"] == 4 / 20


def test_one_lost_case_is_inconclusive_against_a_zero_bar_but_passes_a_loose_one() -> None:
    ref, cand = _rows("h" * 20), _rows("m" + "h" * 19)
    assert paired(ref, cand, bar=0.0)["outcome"] == "inconclusive"
    assert paired(ref, cand, bar=0.2)["outcome"] == "pass"


def test_gains_count_against_losses() -> None:
    out = paired(_rows("hmhm"), _rows("mhhm"), bar=0.0)
    assert out["reference_hit_candidate_miss"] == ["n00"]
    assert out["reference_miss_candidate_hit"] == ["n01"]
    assert out["recall_drop"]["estimate"] == 0.0


def test_no_decided_pairs_is_inconclusive() -> None:
    out = paired(_rows("tt"), _rows("tt"), bar=0.0)
    assert out["recall_drop"] is None and out["outcome"] == "inconclusive"


def test_mcnemar_exact() -> None:
    assert mcnemar_exact(0, 0) == 1.0
    assert mcnemar_exact(5, 0) == 2 / 32
    assert mcnemar_exact(3, 3) == 1.0


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


def test_terminal_table() -> None:
    ref, cand = _rows("h" * 20), _rows("hh" + "m" * 14 + "tttt")
    summary = {
        "reference": "auto",
        "servers": {"auto": server_summary(ref.values()), "int8_per_token_head": server_summary(cand.values())},
        "paired": {"int8_per_token_head": paired(ref, cand, bar=0.0)},
    }
    buf = io.StringIO()
    Console(file=buf, width=80).print(needle_table(summary))
    text = buf.getvalue()
    assert "int8_per_token_head" in text  # not cut at 80 columns
    assert "2/14/4/0" in text and "20/0/0/0" in text
    assert "14/0" in text and "fail" in text and "+0.88" in text
    assert "recall drop at most 0" in text
