"""What `kvprobe memmap` prints: its answer first (KV tokens per dtype, what binds the pool, the lever), then
the tables behind it: a summary across dtypes, one per KV dtype, and the lever grid."""

from __future__ import annotations

from rich.table import Table

from kvprobe.memmap import Lever, MemoryMap
from kvprobe.memmap.shape import ATTENTION_KINDS, NO_KV_KINDS
from kvprobe.memmap.summary import LABELS


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.2f} {unit}"
        n /= 1024
    return f"{n:,.2f} GiB"


def answer_lines(mm: MemoryMap, lv: Lever) -> list[str]:
    """The answer, before any table: each dtype's predicted KV tokens, what binds each sequence's bytes and how
    far a KV dtype can move capacity, and for a hybrid which knob is the lever."""
    tokens = " · ".join(f"{d} {p.kv_cache_tokens:,} KV tokens" + (" (reference)" if d == mm.reference
                                                                   else f" ({mm.ratio(d):.2f}x)")
                        for d, p in mm.plans.items())
    out = [f"{mm.model.name} at max_model_len {mm.max_model_len:,}, {human_bytes(mm.settings.kv_memory_bytes)} KV "
           f"memory ({mm.settings.platform}): {tokens}", mm.conclusion()]
    if lv.ssm_dtypes:
        out.append(f"lever: {lv.sentence()}")
    return out


def dtype_table(mm: MemoryMap, dtype: str) -> Table:
    p = mm.plans[dtype]
    total = p.total_bytes_per_sequence
    block = f"attention block {p.attention_block_size} tokens" if p.attention_block_size else "no attention"
    pad = f", state pages padded {p.padding_pct:.2f}%" if p.padding_pct else ""
    table = Table(title=f"--kv-cache-dtype {dtype}: one sequence of {mm.max_model_len:,} tokens "
                        f"({block}{pad}, {p.num_blocks:,} blocks of {human_bytes(p.bytes_per_block)})",
                  header_style="bold", title_justify="left")
    for col in ("layer type", "layers", "bytes / token (all its layers)", "bytes / sequence", "of which padding",
                "share of pool"):
        table.add_column(col, justify="left" if col == "layer type" else "right", overflow="fold")
    for kind in mm.kinds():
        n = mm.model.count(kind)
        if kind in NO_KV_KINDS:
            table.add_row(LABELS[kind], str(n), "0", "0", "-", "0.0%", style="dim")
            continue
        held = p.bytes_per_sequence.get(kind, 0)
        per_token = f"{p.attention_bytes_per_token[kind]:,}" if kind in ATTENTION_KINDS else "-"
        table.add_row(LABELS[kind], str(n), per_token, human_bytes(held),
                      human_bytes(p.padding_per_sequence.get(kind, 0)), f"{held / total:.1%}")
    ratio = mm.ratio(dtype)
    table.caption = (f"predicted kv_cache_size_tokens {p.kv_cache_tokens:,} · max concurrency "
                     f"{p.max_concurrency:.2f}x · {ratio:.2f}x the {mm.reference} capacity")
    table.caption_justify = "left"
    return table


def summary_table(mm: MemoryMap) -> Table:
    table = Table(title=f"Predicted KV capacity: {mm.model.name} at max_model_len {mm.max_model_len:,}, "
                        f"{human_bytes(mm.settings.kv_memory_bytes)} KV memory",
                  header_style="bold", title_justify="left")
    for col in ("kv dtype", "KV tokens", "max concurrency", "bytes / sequence", "ratio"):
        table.add_column(col, justify="left" if col == "kv dtype" else "right", overflow="fold")
    for dtype, p in mm.plans.items():
        table.add_row(dtype + (" (reference)" if dtype == mm.reference else ""), f"{p.kv_cache_tokens:,}",
                      f"{p.max_concurrency:.2f}x", human_bytes(p.total_bytes_per_sequence), f"{mm.ratio(dtype):.2f}x")
    return table


def lever_table(lv: Lever) -> Table:
    """Rows are KV dtypes, columns Mamba SSM state dtypes: which knob moves capacity reads off the grid."""
    mode = "on (mamba_cache_mode align)" if lv.mode == "align" else "off (mamba_cache_mode none)"
    table = Table(title=f"Predicted KV capacity by --kv-cache-dtype x --mamba-ssm-cache-dtype: {lv.mm.model.name} "
                        f"at max_model_len {lv.mm.max_model_len:,}, prefix caching {mode}",
                  header_style="bold", title_justify="left")
    table.add_column("kv dtype \\ SSM state", justify="left", overflow="fold")
    for ssm in lv.ssm_dtypes:
        table.add_column(ssm, justify="right", overflow="fold")
    ref = lv.reference
    for kv in lv.kv_dtypes:
        row = []
        for ssm in lv.ssm_dtypes:
            c = lv.cell(kv, ssm)
            text = f"{c.kv_cache_tokens:,} ({c.ratio:.2f}x)"
            row.append(f"[bold]{text}[/bold] ref" if c is ref else text)
        table.add_row(kv, *row)
    table.caption = lv.prefix_caching_note()
    table.caption_justify = "left"
    return table
