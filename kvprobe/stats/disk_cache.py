"""The seeded statistics that take seconds, kept on disk from one process to the next.

A speed design's boundary constant (kvprobe.stats.sequential.calibrate: 200,000 simulated runs, or 60,000 for
each of eight noise models) and the exact pass region of a paired 0/1 bar (kvprobe.stats.paired_exact.
exact_pass_limits: a trinomial over 1,025 nuisance values) are pure functions of their arguments, and every
process that plans, judges or verifies a run needs some of them. On the AVX2 EPYC they took 5.6 of the 6.3 s
of `kvprobe check` with the shipped servers.toml, and 78 s of CPU in the unit tests, most of it the same
values in another process. lru_cache keeps them for one process; this keeps them for the next.

A kept value is filed under its function, its arguments, and a fingerprint of the code that computes it (the
source of the modules named and numpy's and scipy's versions): an edit to that code or another numpy is a
new fingerprint, so a value from other code is never read. A file that cannot be read back (torn, foreign) is
computed again; a value that cannot be written (a full or read-only disk) is only not kept, never an error.
KVPROBE_NO_STATS_CACHE=1 computes every value afresh.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import orjson

from kvprobe import settings

T = TypeVar("T")
VERSION = 1  # of the file layout


def encode_float(x: float) -> str:
    return float(x).hex()  # every bit, infinity included


def decode_float(text: Any) -> float:
    return float.fromhex(text)


def encode_int_array(a: np.ndarray) -> dict[str, Any]:
    return {"dtype": str(a.dtype), "values": a.tolist()}


def decode_int_array(data: Any) -> np.ndarray:
    a = np.asarray(data["values"], dtype=np.dtype(data["dtype"]))
    a.setflags(write=False)
    return a


def directory() -> Path:
    return settings.cache_home() / "kvprobe" / "stats"


@functools.cache
def fingerprint(modules: tuple[str, ...]) -> str:
    """What the kept values of a function depend on besides its arguments."""
    import scipy

    digest = hashlib.sha256(f"{VERSION}|numpy {np.__version__}|scipy {scipy.__version__}".encode())
    for name in sorted(set(modules)):
        spec = importlib.util.find_spec(name)
        origin = spec.origin if spec else None
        digest.update(f"|{name}|".encode())
        digest.update(Path(origin).read_bytes() if origin else b"?")
    return digest.hexdigest()[:16]


def kept_on_disk(encode: Callable[[T], Any], decode: Callable[[Any], T]
                 ) -> Callable[[Callable[..., T]], Callable[..., T]]:
    """Keep `fn`'s values on disk, under the code of fn's own module and of kvprobe.stats (the shared helpers)."""

    def wrap(fn: Callable[..., T]) -> Callable[..., T]:
        name = f"{fn.__module__}.{fn.__qualname__}"
        modules = (fn.__module__, "kvprobe.stats")

        @functools.wraps(fn)
        def keep(*args: Any, **kwargs: Any) -> T:
            if settings.stats_cache_off():
                return fn(*args, **kwargs)
            key = repr((args, sorted(kwargs.items())))
            digest = hashlib.sha256(key.encode()).hexdigest()[:32]
            path = directory() / f"{name}-{fingerprint(modules)}" / f"{digest}.json"
            found = _read(path, key, decode)
            if found is not None:
                return found
            value = fn(*args, **kwargs)
            _write(path, key, encode(value))
            return value

        return keep

    return wrap


def _read(path: Path, key: str, decode: Callable[[Any], T]) -> T | None:
    try:
        data = orjson.loads(path.read_bytes())
        if data["key"] != key:  # another argument list with the same digest: never in practice, still checked
            return None
        return decode(data["value"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _write(path: Path, key: str, value: Any) -> None:
    # Its own temporary name per writer: two processes keeping the same value never write into one file.
    with contextlib.suppress(OSError, TypeError, ValueError):
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(orjson.dumps({"key": key, "value": value}))
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
