"""Kernel receive timestamps on stream sockets: when the bytes reached this host, not when the event
loop got round to reading them.

Why: at a few hundred streams, many servers' chunks land at once and the loop reads them one after
another; a time taken in the read callback is the loop's, late by its queue (measured on the AVX2
kind: p99 TTFT/ITL error 2-33 ms at 256 streams, p50 0.03-0.37 ms). With SO_TIMESTAMPNS the kernel
stamps every packet as it arrives (software receive timestamp, CLOCK_REALTIME) and recvmsg hands the
stamp of the last packet a read consumed: the arrival of the newest bytes read, however late the
read runs. kvprobe.server.streaming reads whatever waits at once: packets that queued on one socket
are merged by the kernel (newest stamp) anyway, so reads planned to end at each chunk bought little
and cost half the client's throughput (that module's docstring).

The stamps are converted to time.perf_counter(), the clock every other kvprobe time is on, through
an offset re-measured every second (NTP may slew CLOCK_REALTIME against the monotonic clock by tens
of microseconds a second).
"""

from __future__ import annotations

import socket
import struct
import time

SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)  # Linux; the value is also the cmsg type
_TIMESPEC = struct.Struct("@qq")  # struct timespec {time_t tv_sec; long tv_nsec} on 64-bit Linux
ANCILLARY = socket.CMSG_SPACE(_TIMESPEC.size)
_REFRESH_NS = 1_000_000_000


def enable(sock: socket.socket) -> bool:
    """Ask the kernel to stamp what this socket receives; False where it cannot (not Linux)."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    except OSError:
        return False
    return True


class Clock:
    """CLOCK_REALTIME nanoseconds -> time.perf_counter() seconds."""

    __slots__ = ("_at", "_offset")

    def __init__(self) -> None:
        self._offset = 0
        self._at = 0
        self._measure()

    def _measure(self) -> None:
        # The read pair that took the least time brackets the realtime read most tightly.
        best = None
        for _ in range(5):
            a = time.perf_counter_ns()
            real = time.clock_gettime_ns(time.CLOCK_REALTIME)
            b = time.perf_counter_ns()
            if best is None or b - a < best[0]:
                best = (b - a, real - (a + b) // 2)
        assert best is not None
        self._offset, self._at = best[1], time.perf_counter_ns()

    def perf(self, realtime_ns: int) -> float:
        if time.perf_counter_ns() - self._at > _REFRESH_NS:
            self._measure()
        return (realtime_ns - self._offset) / 1e9


def recv(sock: socket.socket, size: int, clock: Clock) -> tuple[bytes, float | None]:
    """One recvmsg of at most `size` bytes and the kernel's arrival time of the last packet it
    consumed (perf_counter seconds), None when the kernel gave no stamp. Raises what recvmsg raises
    (BlockingIOError when nothing is waiting)."""
    data, ancillary, _flags, _addr = sock.recvmsg(size, ANCILLARY)
    for level, kind, raw in ancillary:
        if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(raw) >= _TIMESPEC.size:
            sec, nsec = _TIMESPEC.unpack_from(raw)
            return data, clock.perf(sec * 1_000_000_000 + nsec)
    return data, None
