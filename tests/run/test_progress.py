"""kvprobe.run.progress: off a terminal (a CI log) a long probe says where it stands once a heartbeat, moving or
waiting, not only when it is done; on a terminal the live bar alone does. The clock is the test's and the refresh
is called by hand (rich's refresh thread calls it a few times a second)."""

from __future__ import annotations

import io
import re
from pathlib import Path

from rich.console import Console
from rich.progress import MofNCompleteColumn, TextColumn

import kvprobe
from kvprobe.run.progress import HEARTBEAT_S, LoggedProgress


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def bar(terminal: bool, clock: Clock) -> tuple[LoggedProgress, io.StringIO]:
    out = io.StringIO()
    console = Console(file=out, force_terminal=terminal, width=100)
    return LoggedProgress(TextColumn("{task.description}"), MofNCompleteColumn(), console=console, unit="needles",
                          get_time=clock, auto_refresh=False), out


def heartbeats(text: str) -> list[str]:
    return [line for line in text.splitlines() if re.search(r" · [\d,]+(/[\d,]+)? needles · \d+:\d\d:\d\d$", line)]


def test_off_a_terminal_each_unfinished_task_says_where_it_stands_once_a_heartbeat() -> None:
    clock = Clock()
    progress, out = bar(False, clock)
    with progress:
        task = progress.add_task("needle: auto", total=180)
        progress.add_task("needle: fp8", total=180)  # waits throughout
        for _ in range(10):  # ten needles in the first half minute: no line yet
            clock.now += 3
            progress.advance(task)
            progress.refresh()
        assert heartbeats(out.getvalue()) == []
        clock.now += HEARTBEAT_S
        progress.update(task, advance=1, description="needle: auto (11 hit)")
        progress.refresh()
        clock.now += 1
        progress.advance(task)
        progress.refresh()  # within the heartbeat of the last line: nothing
        clock.now += HEARTBEAT_S
        progress.refresh()  # nothing moved: it still says where it waits
        progress.update(task, completed=180)
        clock.now += HEARTBEAT_S
        progress.refresh()  # auto finished: the bar printed at the end says the rest
    assert heartbeats(out.getvalue()) == [
        "needle: auto (11 hit) · 11/180 needles · 0:01:30",
        "needle: fp8 · 0/180 needles · 0:01:30",
        "needle: auto (11 hit) · 12/180 needles · 0:02:31",
        "needle: fp8 · 0/180 needles · 0:02:31",
        "needle: fp8 · 0/180 needles · 0:03:31",
    ]
    assert "needle: auto (11 hit) 180/180" in out.getvalue()  # rich's own last render


def test_a_task_of_no_known_total_and_markup_in_its_name() -> None:
    clock = Clock()
    progress, out = bar(False, clock)
    with progress:
        task = progress.add_task("fill: [dim]auto[/dim]", total=None)
        clock.now += HEARTBEAT_S
        progress.advance(task, 12_345)
        progress.refresh()
    assert heartbeats(out.getvalue()) == ["fill: auto · 12,345 needles · 0:01:00"]


def test_on_a_terminal_the_live_bar_alone_says_it() -> None:
    clock = Clock()
    progress, out = bar(True, clock)
    with progress:
        task = progress.add_task("needle: auto", total=180)
        for _ in range(5):
            clock.now += HEARTBEAT_S
            progress.advance(task)
            progress.refresh()
    assert "needle: auto" in out.getvalue() and heartbeats(out.getvalue()) == []


def test_every_probe_bar_is_a_logged_one() -> None:
    probes = Path(kvprobe.__file__).parent / "probes"
    plain = [f"{p.name}:{i}" for p in sorted(probes.glob("*.py"))
             for i, line in enumerate(p.read_text().splitlines(), 1) if re.search(r"(?<!Logged)Progress\(", line)]
    assert plain == [], "a rich Progress in a probe prints nothing in a CI log until it is done: use LoggedProgress"
