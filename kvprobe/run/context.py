"""What every probe is handed: the config, the open clients, the servers' facts, where to write, the
reporter that shows what a probe found as it ends, and the judge a probe may stop on.

The reporter and the judge are seams, not imports: the pipeline passes the terminal's reporter
(kvprobe.report.live) and the verdict's checks (kvprobe.verdict.checks.live_checks), and a probe only
calls them, so probes import neither the report nor the verdict, both above them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

from rich.console import Console
from rich.markup import escape

if TYPE_CHECKING:
    from kvprobe.config import Bars, Config
    from kvprobe.run.store import RunDir
    from kvprobe.server.client import Client
    from kvprobe.server.inventory import Inventory
    from kvprobe.server.pin import PinCheck

Chart = Literal["memmap", "lever", "needle_status", "needle_paired"]


class Reporter(Protocol):
    def probe_done(self, probe: str, summary: dict[str, Any], servers: list[str]) -> None:
        """A probe ended: show its checks for these servers as the verdict will carry them."""

    def draw(self, chart: Chart, data: Any, path: Path) -> Path | None:
        """Draw one of a probe's charts into `path`; the file written, or None when there is nothing
        to draw."""


class Judge(Protocol):
    def __call__(self, probe: str, summary: dict[str, Any], reference: str, candidates: list[str],
                 bars: Bars) -> dict[str, list[dict[str, Any]]]:
        """Each candidate's checks on a probe's summary so far, as the verdict will judge them."""


class SilentReporter:
    """Shows nothing and draws nothing: for a context built outside a run (tests, the canary's replay)."""

    def probe_done(self, probe: str, summary: dict[str, Any], servers: list[str]) -> None:
        return None

    def draw(self, chart: Chart, data: Any, path: Path) -> Path | None:
        return None


@dataclass
class EvalContext:
    """What every probe gets: the config, the open clients, the facts, and where to write."""

    config: Config
    run: RunDir
    clients: dict[str, Client]
    inventories: dict[str, Inventory]
    pin: PinCheck
    console: Console
    results: dict[str, Any] = field(default_factory=dict)
    broken: dict[str, str] = field(default_factory=dict)  # server -> last error, set by probes
    warned: set[str] = field(default_factory=set)
    deadline: float | None = None  # the canary's --budget (time.monotonic()): a probe may stop short of it
    reporter: Reporter = field(default_factory=SilentReporter)
    judge: Judge | None = None  # the load probe stops its blocks when its speed checks are settled

    @property
    def reference(self) -> str:
        return self.config.reference.name

    def active(self) -> list[str]:
        """Servers to measure: the reference and each serving, valid candidate not yet broken."""
        names = []
        for server in self.config.servers:
            inv = self.inventories[server.name]
            if not inv.serving or server.name in self.broken:
                continue
            if server.role == "candidate" and not self.pin.candidate_valid(server.name):
                continue
            names.append(server.name)
        return names

    def measuring(self, name: str) -> bool:
        """Whether another request to `name` can still count: not once it broke, nor once the reference did
        (nothing a candidate answers then can be compared). The reference finishes the probe it is in once every
        candidate broke (its figures stand in the report and for `compare`); the probes after it are not run."""
        return name not in self.broken and self.reference not in self.broken

    def every_candidate_broke(self) -> bool:
        """No candidate is left to measure and at least one broke during the run (one that never served, or an
        invalid comparison, is settled before the probes and has its own word)."""
        return (not any(n != self.reference for n in self.active())
                and any(c.name in self.broken for c in self.config.candidates))

    def warn(self, line: str) -> None:
        """A warning printed once per run, however many requests meet it."""
        if line not in self.warned:
            self.warned.add(line)
            self.console.print(f"[yellow]warning:[/yellow] {escape(line)}", highlight=False, soft_wrap=True)

    def mark_broken(self, name: str, error: str) -> None:
        """A server failed during a probe: it gets no more requests; what it finished is kept."""
        if name not in self.broken:
            self.broken[name] = error
            self.run.event("broken", server=name, error=error)
            self.console.print(f"[red]{name} is broken:[/red] {escape(error)}")
