"""kvprobe.stats.disk_cache: a kept value is the computed value, bit for bit; code that changed is never
answered from a file kept by the old code; a torn file or a disk that refuses the write costs a
computation, never an error."""

from __future__ import annotations

import errno
import importlib
import math
import sys
from pathlib import Path

import numpy as np
import pytest

from kvprobe import settings
from kvprobe.stats import disk_cache
from kvprobe.stats.paired_exact import exact_pass_limits
from kvprobe.stats.sequential import ROBUST, T, calibrate


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(settings.XDG_CACHE_HOME, str(tmp_path))
    monkeypatch.delenv(settings.NO_STATS_CACHE, raising=False)
    return tmp_path / "kvprobe" / "stats"


def counted(values: dict[tuple, float], calls: list[tuple]):
    @disk_cache.kept_on_disk(disk_cache.encode_float, disk_cache.decode_float)
    def value(a: int, b: float) -> float:
        calls.append((a, b))
        return values[(a, b)]

    return value


def test_a_value_is_computed_once_and_then_read_back_exactly(cache: Path) -> None:
    calls: list[tuple] = []
    value = counted({(1, 0.1): 0.1 + 0.2, (2, 0.1): math.inf}, calls)
    assert value(1, 0.1) == 0.1 + 0.2 and value(2, 0.1) == math.inf
    assert value(1, 0.1) == 0.30000000000000004 and value(2, 0.1) == math.inf  # every bit, infinity too
    assert calls == [(1, 0.1), (2, 0.1)]
    assert len(list(cache.rglob("*.json"))) == 2


def test_the_arguments_are_the_key(cache: Path) -> None:
    calls: list[tuple] = []
    value = counted({(1, 0.1): 1.0, (1, 0.10000000000000002): 2.0}, calls)
    assert value(1, 0.1) == 1.0 and value(1, 0.10000000000000002) == 2.0  # the next float up is another key
    assert len(calls) == 2


def test_a_torn_or_foreign_file_is_computed_again_and_replaced(cache: Path) -> None:
    calls: list[tuple] = []
    value = counted({(1, 0.1): 3.5}, calls)
    value(1, 0.1)
    (kept,) = cache.rglob("*.json")
    torn, foreign = b'{"key": "(', b'{"key": "another", "value": "0x1p+0"}'
    for garbage in (torn, b"", b'{"key": "((1, 0.1), [])", "value": 7}', foreign):
        kept.write_bytes(garbage)
        assert value(1, 0.1) == 3.5
    assert len(calls) == 5
    assert value(1, 0.1) == 3.5 and len(calls) == 5  # rewritten whole by the last computation


def test_a_full_disk_costs_a_computation_not_an_error(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def full(*args: object, **kwargs: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(disk_cache.tempfile, "mkstemp", full)
    calls: list[tuple] = []
    value = counted({(1, 0.1): 3.5}, calls)
    assert value(1, 0.1) == 3.5 and value(1, 0.1) == 3.5
    assert len(calls) == 2 and not list(cache.rglob("*.json"))


def test_a_cache_directory_that_is_a_file_costs_a_computation_not_an_error(cache: Path) -> None:
    cache.parent.mkdir(parents=True)
    cache.write_text("not a directory")  # what a full or broken home looks like to mkdir: an OSError
    calls: list[tuple] = []
    value = counted({(1, 0.1): 3.5}, calls)
    assert value(1, 0.1) == 3.5 and value(1, 0.1) == 3.5
    assert len(calls) == 2


def test_the_switch_computes_every_value_afresh(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(settings.NO_STATS_CACHE, "1")
    calls: list[tuple] = []
    value = counted({(1, 0.1): 3.5}, calls)
    value(1, 0.1)
    value(1, 0.1)
    assert len(calls) == 2 and not cache.exists()


def test_changed_code_is_a_new_fingerprint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    module = tmp_path / "kvprobe_fingerprint_probe.py"
    module.write_text("C = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    first = disk_cache.fingerprint(("kvprobe_fingerprint_probe",))
    module.write_text("C = 2\n")
    disk_cache.fingerprint.cache_clear()
    assert disk_cache.fingerprint(("kvprobe_fingerprint_probe",)) != first
    sys.modules.pop("kvprobe_fingerprint_probe", None)


def test_every_value_depends_on_the_shared_helpers_and_numpys_version(monkeypatch: pytest.MonkeyPatch) -> None:
    modules = ("kvprobe.stats.sequential", "kvprobe.stats")
    first = disk_cache.fingerprint(modules)
    disk_cache.fingerprint.cache_clear()
    monkeypatch.setattr(np, "__version__", "0.0.0")
    assert disk_cache.fingerprint(modules) != first
    disk_cache.fingerprint.cache_clear()


@pytest.mark.parametrize(("looks", "statistic"), [((4, 8, 12, 16, 20), T), ((8, 12), ROBUST), ((1,), T)])
def test_a_kept_calibration_is_the_fresh_one(cache: Path, looks: tuple[int, ...], statistic: str) -> None:
    kept = calibrate.__wrapped__  # past the lru_cache: through the disk
    fresh = kept.__wrapped__
    first = kept(looks, 0.025, statistic)  # computed and written
    assert list(cache.rglob("*.json"))
    assert kept(looks, 0.025, statistic) == first == fresh(looks, 0.025, statistic)  # read back: the same bits


def test_a_kept_pass_region_is_the_fresh_one(cache: Path) -> None:
    kept = exact_pass_limits.__wrapped__
    fresh = kept.__wrapped__(57, 0.1)
    kept(57, 0.1)
    again = kept(57, 0.1)  # read back
    assert again.dtype == fresh.dtype and np.array_equal(again, fresh)
    assert not again.flags.writeable  # as the computed one: callers share it
