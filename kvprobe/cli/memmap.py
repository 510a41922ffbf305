"""kvprobe memmap: where the KV bytes are, predicted from a config.json."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click
import orjson

from kvprobe.cli._common import (
    _fail,
    err_console,
    out_console,
)
from kvprobe.errors import (
    ConfigError,
    DiskError,
)

if TYPE_CHECKING:
    from rich.table import Table

    from kvprobe.memmap import Lever, MemoryMap


def _parse_bytes(text: str) -> int:
    """'1073741824', '1GiB', '512MiB', '8GB' -> bytes."""
    units = {"": 1, "b": 1, "k": 1000, "kb": 1000, "kib": 1024, "m": 1000**2, "mb": 1000**2, "mib": 1024**2,
             "g": 1000**3, "gb": 1000**3, "gib": 1024**3, "t": 1000**4, "tb": 1000**4, "tib": 1024**4}
    raw = text.strip().lower().replace("_", "").replace(",", "")
    number = raw.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = raw[len(number):].strip()
    try:
        value = float(number) * units[unit]
    except (ValueError, KeyError):
        raise click.BadParameter(f"{text!r} is not a size like 1073741824, 1GiB or 512MiB") from None
    if value < 1:
        raise click.BadParameter(f"{text!r} must be positive")
    return int(value)


@click.command()
@click.argument("config", type=click.Path(path_type=Path))
@click.option("--max-model-len", type=click.IntRange(min=1), default=None,
              help="tokens per request (default: the config's max_position_embeddings)")
@click.option("--kv-dtype", "kv_dtypes", default="auto,fp8", show_default=True,
              help="comma-separated --kv-cache-dtype values; the first is the reference")
@click.option("--kv-memory", default="1GiB", show_default=True, help="KV cache memory (bytes, or 1GiB, 512MiB)")
@click.option("--mamba-ssm-dtype", default="auto", show_default=True,
              type=click.Choice(["auto", "float32", "float16", "bfloat16"]),
              help="SSM state dtype (auto: the model's default, float32 for NemotronH)")
@click.option("--mamba-cache-dtype", default="auto", show_default=True,
              type=click.Choice(["auto", "float32", "float16", "bfloat16"]), help="conv state dtype")
@click.option("--mamba-cache-mode", default="auto", show_default=True, type=click.Choice(["auto", "align", "none"]),
              help="align: prefix caching on; none: off; auto: vLLM's default (align for hybrids)")
@click.option("--platform", "platform_name", default="cpu", show_default=True, type=click.Choice(["cpu", "cuda"]),
              help="whose byte layout: the vLLM CPU build's, or CUDA's (per-token-head scales, nvfp4 packing)")
@click.option("--block-size", default=None, type=click.IntRange(min=1),
              help="vLLM --block-size (default: 128 on cpu, the CPU build's; 16 on cuda)")
@click.option("--block-align", default=128, show_default=True, type=click.IntRange(min=1),
              help="hybrid alignment unit in tokens (128 measured on the CPU build)")
@click.option("--max-num-batched-tokens", default=2048, show_default=True, type=click.IntRange(min=1),
              help="sliding-window layers reserve blocks for this many in-flight tokens")
@click.option("--chart", type=click.Path(path_type=Path), default=None,
              help="write the 'where the bytes are' PNG here (none unless told)")
@click.option("--lever-chart", type=click.Path(path_type=Path), default=None,
              help="write the KV x SSM state dtype PNG of a hybrid here (with --chart: its name + -lever)")
@click.option("--json", "as_json", is_flag=True, help="print JSON instead of tables")
def memmap(config: Path, max_model_len: int | None, kv_dtypes: str, kv_memory: str, mamba_ssm_dtype: str,
           mamba_cache_dtype: str, mamba_cache_mode: str, platform_name: str, block_size: int | None, block_align: int,
           max_num_batched_tokens: int, chart: Path | None, lever_chart: Path | None, as_json: bool) -> None:
    """Where the KV bytes are, the most a KV dtype can free, and (for a hybrid) which knob moves capacity:
    KV dtype or Mamba SSM state dtype. Predicted from a config.json."""
    from kvprobe.memmap import Settings, build, lever

    try:
        settings = Settings(
            kv_memory_bytes=_parse_bytes(kv_memory), block_size=block_size or 0, block_align=block_align,
            platform=platform_name,
            mamba_cache_mode=None if mamba_cache_mode == "auto" else mamba_cache_mode,
            mamba_cache_dtype=mamba_cache_dtype,
            mamba_ssm_cache_dtype=mamba_ssm_dtype, max_num_batched_tokens=max_num_batched_tokens,
        )
        mm = build(config, [d.strip() for d in kv_dtypes.split(",") if d.strip()], max_model_len, settings)
        lv = lever(mm)
    except click.BadParameter as exc:
        _fail([f"--kv-memory: {exc.message}"])
    except ConfigError as exc:
        _fail(exc.problems)
    # Checked here, not in build(): eval sizes the map at a server's own max_model_len, which a server started
    # with VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 may set past the model's.
    if max_model_len is not None and (longest := mm.model.longest()) is not None and max_model_len > longest[0]:
        _fail([f"--max-model-len {max_model_len} is past {mm.model.name}'s {longest[0]:,} tokens ({longest[1]} in "
               f"{config}): vLLM refuses a longer one; give --max-model-len {longest[0]} or less"])
    if as_json:
        click.echo(orjson.dumps({"platform": settings.platform, **mm.to_json(), "lever": lv.to_json()},
                                option=orjson.OPT_INDENT_2).decode())
    else:
        _print_tables(mm, lv)
    _write_charts(mm, lv, chart, lever_chart)


SCALES = ("KV tokens scale with --kv-memory and the ratios hold at any size: give your servers' KV memory (vLLM "
          "logs it as the available KV cache memory) for their token counts")


def _print_tables(mm: MemoryMap, lv: Lever) -> None:
    """The answer first, then the tables behind it (notes, the model's assumptions, on stderr between)."""
    from kvprobe.report.memmap_table import answer_lines, dtype_table, lever_table, summary_table

    for answer in answer_lines(mm, lv):
        _print_wrapped(answer)
    for note in mm.model.notes:
        err_console.print(f"[yellow]note:[/yellow] {note}", highlight=False)
    out_console.print()
    _print_titled(summary_table(mm))
    _print_wrapped(SCALES)
    for table in (*(dtype_table(mm, dtype) for dtype in mm.plans), *([lever_table(lv)] if lv.ssm_dtypes else [])):
        _print_titled(table)


def _print_wrapped(text: str, style: str | None = None) -> None:
    """`text` wrapped between words at the terminal's width (kvprobe.report.wrap), no line padded."""
    from kvprobe.report.wrap import wrap

    for line in wrap(text, out_console.width):
        out_console.print(line, style=style, highlight=False, markup=False, soft_wrap=True)


def _print_titled(table: Table) -> None:
    """A table under its title, the title wrapped at the terminal's width: rich wraps it at the table's, which
    is narrower than the title."""
    title, table.title = str(table.title or ""), None
    _print_wrapped(title, style="table.title")
    out_console.print(table)


def _write_charts(mm: MemoryMap, lv: Lever, chart: Path | None, lever_chart: Path | None) -> None:
    """The charts asked for by --chart and --lever-chart; a chart that cannot be written exits 2."""
    from kvprobe.report.bytes_chart import bytes_chart
    from kvprobe.report.lever_chart import lever_chart as draw_lever

    # Charts only where told: a command that prints a prediction does not litter the working directory.
    charts = []
    if chart is not None:
        charts.append(("--chart", chart, lambda p: bytes_chart(mm, p), "chart"))
    # A dense model's grid is one column: the bytes chart already shows everything it would.
    if lv.ssm_dtypes and (lever_chart is not None or chart is not None):
        where = lever_chart or chart.with_name(f"{chart.stem}-lever{chart.suffix or '.png'}")  # type: ignore[union-attr]
        charts.append(("--lever-chart", where, lambda p: draw_lever(lv, p), "lever chart"))
    for option, path, draw, label in charts:
        try:
            written = draw(path)
        except DiskError as exc:
            _fail([f"{option} {path}: cannot write the chart: {exc.cause}"])
        err_console.print(f"{label}: [bold]{written}[/bold]", highlight=False)
