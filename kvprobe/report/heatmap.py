"""Needle heatmaps (length x depth): one per server coloured by status, one per candidate coloured
by how it differs from the reference on the same cases.

Drawn with matplotlib's object API on an Agg canvas: no pyplot, so no global backend or figure
state is touched (safe inside a long-running process and beside other plotting code).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import BoundaryNorm, ListedColormap
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from kvprobe.report.save import save_png

# Per server: worst first, so a cell holding several cases shows its worst outcome.
STATUS_STYLE: dict[str, tuple[str, str, str]] = {  # colour, legend, cell label
    "error": ("#525252", "error", "error"),
    "miss": ("#d62728", "miss", "miss"),
    "truncated": ("#ff9f1c", "truncated", "trunc."),
    "hit": ("#2ca02c", "hit", "hit"),
}
# Candidate vs reference on the same case, worst first.
PAIRED_STYLE: dict[str, tuple[str, str, str]] = {
    "lost": ("#d62728", "reference hit, candidate miss", "lost"),
    "lost_truncated": ("#ff9f1c", "reference hit, candidate truncated", "lost (trunc.)"),
    "error": ("#525252", "error on either side", "error"),
    "gained": ("#1f77b4", "reference missed, candidate hit", "gained"),
    "both_not_hit": ("#bdbdbd", "neither hit", "neither"),
    "both_hit": ("#b8e2b0", "both hit", "both hit"),
}
_EMPTY = "#ffffff"


def _axes_values(cases: Iterable[dict[str, Any]]) -> tuple[list[int], list[float]]:
    cases = list(cases)
    return sorted({c["target_length"] for c in cases}), sorted({c["target_depth"] for c in cases})


def _draw(cells: dict[tuple[int, float], list[str]], lengths: Sequence[int], depths: Sequence[float],
          style: dict[str, tuple[str, str, str]], title: str, path: Path) -> Path:
    order = list(style)
    codes = [[-1] * len(depths) for _ in lengths]
    labels = [[""] * len(depths) for _ in lengths]
    for (length, depth), kinds in cells.items():
        row, col = lengths.index(length), depths.index(depth)
        worst = min(kinds, key=order.index)
        codes[row][col] = order.index(worst)
        # a text label too, so the map reads without colour; several cases: how many are the worst
        labels[row][col] = style[worst][2] + (f" {kinds.count(worst)}/{len(kinds)}" if len(kinds) > 1 else "")
    cmap = ListedColormap([_EMPTY] + [style[k][0] for k in order])
    norm = BoundaryNorm([i - 0.5 for i in range(-1, len(order) + 1)], cmap.N)

    fig = Figure(figsize=(1.2 + 1.1 * len(depths), 1.6 + 0.55 * len(lengths)), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.imshow(codes, cmap=cmap, norm=norm, aspect="auto", origin="lower")
    ax.set_xticks(range(len(depths)), [f"{d:.0%}" for d in depths])
    ax.set_yticks(range(len(lengths)), [f"{n:,}" for n in lengths])
    ax.set_xlabel("needle depth (share of the haystack)")
    ax.set_ylabel("prompt length (tokens)")
    ax.set_title(title, fontsize=10)
    ax.set_xticks([x - 0.5 for x in range(1, len(depths))], minor=True)
    ax.set_yticks([y - 0.5 for y in range(1, len(lengths))], minor=True)
    ax.grid(which="minor", color="white", linewidth=1.5)
    ax.tick_params(which="minor", length=0)
    for row, line in enumerate(labels):
        for col, text in enumerate(line):
            if text:
                dark = codes[row][col] >= 0 and order[codes[row][col]] in ("error", "miss", "lost", "gained")
                ax.text(col, row, text, ha="center", va="center", fontsize=8, color="white" if dark else "black")
    present = sorted({min(k, key=order.index) for k in cells.values()}, key=order.index)
    ax.legend(handles=[Patch(color=style[k][0], label=style[k][1]) for k in present],
              loc="upper center", bbox_to_anchor=(0.5, -0.18 - 0.02 * len(depths) / 5), ncol=2, fontsize=8,
              frameon=False)
    return save_png(fig, path, dpi=110)


def status_heatmap(cases: list[dict[str, Any]], server: str, path: Path) -> Path:
    """Colour = status of `server`'s case in each (length, depth) cell; white = not run."""
    lengths, depths = _axes_values(cases)
    cells: dict[tuple[int, float], list[str]] = defaultdict(list)
    mine = [c for c in cases if c["server"] == server]
    for c in mine:
        cells[(c["target_length"], c["target_depth"])].append(c["status"])
    hits = sum(c["status"] == "hit" for c in mine)
    return _draw(cells, lengths, depths, STATUS_STYLE, f"needle retrieval: {server} ({hits}/{len(mine)} hit)", path)


def paired_kind(ref_status: str, cand_status: str) -> str:
    if "error" in (ref_status, cand_status):
        return "error"
    if ref_status == "hit":
        return {"hit": "both_hit", "miss": "lost", "truncated": "lost_truncated"}[cand_status]
    return "gained" if cand_status == "hit" else "both_not_hit"


def paired_heatmap(cases: list[dict[str, Any]], reference: str, candidate: str, path: Path) -> Path:
    """Colour = how `candidate` differs from `reference` on the same case."""
    lengths, depths = _axes_values(cases)
    ref = {c["id"]: c for c in cases if c["server"] == reference}
    cand = {c["id"]: c for c in cases if c["server"] == candidate}
    cells: dict[tuple[int, float], list[str]] = defaultdict(list)
    for case_id in sorted(set(ref) & set(cand)):
        c = ref[case_id]
        cells[(c["target_length"], c["target_depth"])].append(paired_kind(c["status"], cand[case_id]["status"]))
    kinds = [k for ks in cells.values() for k in ks]
    title = (f"needle: {candidate} vs {reference}\nwhere {reference} hit: {kinds.count('lost')} missed, "
             f"{kinds.count('lost_truncated')} truncated; {kinds.count('gained')} gained; {len(kinds)} cases")
    return _draw(cells, lengths, depths, PAIRED_STYLE, title, path)
