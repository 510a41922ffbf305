"""The probes' progress bars, which also show progress in a CI log.

rich draws a live bar only on a terminal. On anything else (a CI job's log, `| tee`, nohup) it prints the
bar once, when the work is done, so a 13-minute needle probe on a 2-core box was 13 silent minutes in the
log (the AVX2 demo, 2026-12-08). Off a terminal this Progress also prints one plain line per unfinished task
every HEARTBEAT_S seconds, moving or waiting: where it stands, of how many, since when.
"""

from __future__ import annotations

from typing import Any

from rich.console import RenderableType
from rich.progress import Progress, TaskID
from rich.text import Text

HEARTBEAT_S = 60.0


class LoggedProgress(Progress):
    """rich's Progress, plus a line per task every `heartbeat_s` seconds where no live bar is drawn.
    `unit` names what the counts count ("needles", "windows")."""

    def __init__(self, *columns: Any, unit: str = "", heartbeat_s: float = HEARTBEAT_S, **kwargs: Any) -> None:
        self.unit = unit
        self.heartbeat_s = heartbeat_s
        self._said_at: dict[TaskID, float] = {}
        super().__init__(*columns, **kwargs)  # renders once, before the heartbeats have a console to say them on

    def add_task(self, description: str, *args: Any, **kwargs: Any) -> TaskID:
        task_id = super().add_task(description, *args, **kwargs)
        self._said_at[task_id] = self.get_time()  # its first line a heartbeat after it starts
        return task_id

    def get_renderable(self) -> RenderableType:
        # Called on every refresh (rich's refresh thread, a few times a second, on a terminal or not): a task that
        # stands still, one long request, still gets its line, which says the run is alive and where it waits.
        if hasattr(self, "live") and not self.console.is_terminal and not self.disable:
            for task_id in list(self._said_at):
                self._heartbeat(task_id)
        return super().get_renderable()

    def _heartbeat(self, task_id: TaskID) -> None:
        now = self.get_time()
        if now - self._said_at.get(task_id, now) < self.heartbeat_s:
            return
        self._said_at[task_id] = now
        task = self._tasks.get(task_id)
        if task is None or task.finished:
            return  # the bar itself is printed when the work is done
        count = f"{task.completed:,.0f}" + (f"/{task.total:,.0f}" if task.total is not None else "")
        elapsed = int(task.elapsed or 0)
        unit = f" {self.unit}" if self.unit else ""
        self.console.print(f"{Text.from_markup(task.description).plain} · {count}{unit} · "
                           f"{elapsed // 3600}:{elapsed // 60 % 60:02d}:{elapsed % 60:02d}",
                           markup=False, highlight=False, soft_wrap=True)
