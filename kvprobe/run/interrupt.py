"""Ctrl-C, remembered for the length of a run.

asyncio.run answers the first Ctrl-C by cancelling the run's task, which relies on every await between
there and the top letting the CancelledError through. A library that catches it would let the run go
on to sign a verdict the operator asked it not to finish. So the run also remembers the press and
checks it where it stops anyway: before each probe and before the verdict.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType, TracebackType
from typing import Any


class CtrlC:
    """`with CtrlC() as ctrl_c:` beside the handler in place (asyncio.run's, or Python's own);
    `ctrl_c.check()` raises KeyboardInterrupt once Ctrl-C was pressed."""

    def __init__(self) -> None:
        self.pressed = False
        self._previous: Any = None  # the handler this one stands beside, while installed

    def __enter__(self) -> CtrlC:
        # Signal handlers belong to the main thread; an ignored SIGINT stays ignored.
        if threading.current_thread() is threading.main_thread():
            previous = signal.getsignal(signal.SIGINT)
            if callable(previous):
                self._previous = previous
                signal.signal(signal.SIGINT, self._on_sigint)
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if self._previous is not None and signal.getsignal(signal.SIGINT) == self._on_sigint:
            signal.signal(signal.SIGINT, self._previous)
        self._previous = None

    def _on_sigint(self, signum: int, frame: FrameType | None) -> None:
        self.pressed = True
        self._previous(signum, frame)

    def check(self) -> None:
        if self.pressed:
            raise KeyboardInterrupt
