"""A full disk (or a read-only one, or a quota) during `eval`: one line naming the file and the cause,
exit 2, every event appended before it whole on disk, and `--resume` with space again ends in the
decisions of a run that never met it. The disk is tests/fulldisk.py, which refuses writes on cue at
the one place every write goes through; the servers are replayed real captures."""

from __future__ import annotations

import errno
import fnmatch
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner, Result
from fulldisk import FullDisk
from needle_fakes import NeedleModel, ToyTokenizer, fake_server
from replay import SERVERS_TOML, MultiReplay, Replay

from kvprobe import cli
from kvprobe.disk import append_line, write_atomic
from kvprobe.errors import DiskError
from kvprobe.evaluate import orchestrate as evaluation
from kvprobe.probes.perplexity import is_server_failure
from kvprobe.run.store import RunDir

MAKE_CLIENTS = evaluation.make_clients  # the real one: tests give it their replay transport

NEEDLE_TOML = """
[bars]
needle_recall_drop_max = 0.0

[needle]
count = 6
lengths = [600, 1500]
depths = [0.0, 0.5, 1.0]
""" + SERVERS_TOML + """
[[server]]
name = "int8"
url = "http://127.0.0.1:8103"
"""
LOAD_TOML = SERVERS_TOML + """
[load]
agents = [1, 2]
turns = 2
repeats = 2
system_tokens = 64
tokens_per_turn = 32
metrics_interval_s = 0.05
warmup = false
settle_s = 0
"""
CAUSES = {errno.ENOSPC: "No space left on device", errno.EROFS: "Read-only file system",
          errno.EDQUOT: "Disk quota exceeded", errno.EACCES: "Permission denied"}


def trio() -> MultiReplay:
    """auto and fp8 retrieve every needle, int8 none: the verdict rejects int8, exit 1."""
    tok = ToyTokenizer()
    return MultiReplay({f"127.0.0.1:{port}": fake_server(NeedleModel(tok, mode), tok)
                        for port, mode in ((8101, "retrieves"), (8102, "retrieves"), (8103, "lost"))})


def pair() -> MultiReplay:
    return MultiReplay({"127.0.0.1:8101": Replay("auto-8101"), "127.0.0.1:8102": Replay("fp8-8102")})


def kvprobe_eval(monkeypatch: pytest.MonkeyPatch, fleet: MultiReplay, *args: str) -> Result:
    transport = fleet.transport()
    monkeypatch.setattr(evaluation, "make_clients", lambda config, _=None: MAKE_CLIENTS(config, transport))
    return CliRunner().invoke(cli.main, ["eval", *args])


def decisions(out: Path) -> dict:
    return orjson.loads((out / "verdict.json").read_bytes())["decisions"]


def events_whole(out: Path) -> list[dict]:
    """Every line of events.jsonl, each one whole JSON (a torn last line would fail here)."""
    data = (out / "events.jsonl").read_bytes()
    assert data.endswith(b"\n") or not data
    return [orjson.loads(line) for line in data.splitlines()]


def checks(decided: dict) -> dict[str, list[tuple[str, str | None]]]:
    return {name: sorted((c["bar"], c.get("case") or "") for c in d.get("checks") or []) for name, d in decided.items()}


def errors(result: Result) -> list[str]:
    return [line for line in result.stderr.splitlines() if line.startswith("error:")]


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[int, dict]]:
    """Exit code and decisions of runs that never met a full disk."""
    found = {}
    with pytest.MonkeyPatch.context() as mp:
        for name, toml, fleet, probes in (("needle", NEEDLE_TOML, trio, "capacity,needle"),
                                          ("load", LOAD_TOML, pair, "capacity,load")):
            base = tmp_path_factory.mktemp(f"clean-{name}")
            (base / "servers.toml").write_text(toml)
            result = kvprobe_eval(mp, fleet(), "--servers", str(base / "servers.toml"), "--out", str(base / "run"),
                                  "--probes", probes)
            found[name] = (result.exit_code, decisions(base / "run"))
    return found


def full_then_resume(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, disk: FullDisk, toml: str, fleet,
                     probes: str) -> tuple[Result, Result, Path, Path, list[dict]]:
    servers, out = tmp_path / "servers.toml", tmp_path / "run"
    servers.write_text(toml)
    monkeypatch.setattr(os, "write", disk.write)
    full = kvprobe_eval(monkeypatch, fleet(), "--servers", str(servers), "--out", str(out), "--probes", probes)
    kept = events_whole(out) if (out / "events.jsonl").exists() else []
    disk.free()
    if (out / "run.json").exists():
        again = kvprobe_eval(monkeypatch, fleet(), "--servers", str(servers), "--resume", str(out))
    else:  # refused before the run was recorded: the line says to start it again
        again = kvprobe_eval(monkeypatch, fleet(), "--servers", str(servers), "--out", str(out), "--probes", probes)
    return full, again, servers, out, kept


@pytest.mark.parametrize("target", [
    "run.json", "inventory/fp8.json", "capacity.json", "needle/cases.json", "needle/heatmap-auto.png",
    "needle/paired-int8.png", "needle.json", "verdict.json", "verdict.json.sig", "plots/capacity.png",
    "events.jsonl", "report.md", "report.html",
])
def test_a_full_disk_at_any_file_is_one_line_exit_2_and_resume_gives_the_same_decisions(
        tmp_path, monkeypatch, clean, target: str) -> None:
    disk = FullDisk(tmp_path / "run", at=target)
    full, again, servers, out, kept = full_then_resume(tmp_path, monkeypatch, disk, NEEDLE_TOML, trio,
                                                       "capacity,needle")
    assert full.exit_code == 2, full.output
    assert "Traceback" not in full.output and isinstance(full.exception, SystemExit)
    refused = out / disk.refused[0]
    command = ["kvprobe", "eval", "--servers", str(servers)]
    if target == "run.json":
        finish = f"start it again with `{shlex.join([*command, '--out', str(out)])}`"
    else:
        finish = f"finish it with `{shlex.join([*command, '--resume', str(out)])}`"
    assert errors(full) == [f"error: cannot write {refused}: No space left on device: free space and {finish}"]
    assert fnmatch.fnmatch(disk.refused[0], target)
    assert not list(out.rglob(".*.tmp"))  # no half-written temporary left taking space

    code, want = clean["needle"]
    assert again.exit_code == code, again.output
    assert decisions(out) == want
    assert events_whole(out)[:len(kept)] == kept  # what was on disk before is still the start of the log
    assert CliRunner().invoke(cli.main, ["verify", str(out)]).exit_code == 0  # the signature is over these bytes


# The load probe appends ~50 kB of events here; a unit is ~2-6 kB of them.
@pytest.mark.parametrize(("at", "after"), [("events.jsonl", 12_000), ("events.jsonl", 25_000),
                                           ("load.json", 5_000), ("plots/latency.png", 10_000)])
def test_a_disk_filling_up_mid_write_keeps_every_whole_event_and_resume_finishes(
        tmp_path, monkeypatch, clean, at: str, after: int) -> None:
    """The disk fills up in the middle of a write (an events line, a summary, a plot), which is cut
    short: the events log ends in a whole line, and the interrupted load unit is measured again in
    full on resume."""
    disk = FullDisk(tmp_path / "run", at=at, after=after)
    full, again, _, out, kept = full_then_resume(tmp_path, monkeypatch, disk, LOAD_TOML, pair, "capacity,load")
    assert full.exit_code == 2, full.output
    # the run stopped at the first refusal (request rows already handed to the writer thread may each be
    # refused too, all in the same file)
    assert set(disk.refused) == {at}
    (line,) = errors(full)
    assert line.startswith(f"error: cannot write {out}/") and ": No space left on device: free space and " in line
    assert events_whole(out)[:len(kept)] == kept
    code, want = clean["load"]
    assert again.exit_code == code, again.output
    # Replayed speed is noise (the outcomes vary run to run), so: the same checks on the same cases.
    assert checks(decisions(out)) == checks(want)
    load = orjson.loads((out / "load.json").read_bytes())
    for name in ("auto", "fp8"):  # every unit measured once in the summary, the interrupted one redone
        assert [(c["agents"], c["requests"]) for c in load["servers"][name]["cases"]] == [(1, 4), (2, 8)]


@pytest.mark.parametrize("code", [errno.EROFS, errno.EDQUOT, errno.EACCES])
def test_every_refusal_of_the_disk_names_its_cause(tmp_path, monkeypatch, code: int) -> None:
    disk = FullDisk(tmp_path / "run", at="needle/heatmap-*.png", code=code)
    full, again, _, out, _ = full_then_resume(tmp_path, monkeypatch, disk, NEEDLE_TOML, trio, "capacity,needle")
    assert full.exit_code == 2
    (line,) = errors(full)
    assert line.startswith(f"error: cannot write {out / disk.refused[0]}: {CAUSES[code]}: free space and finish it")
    assert again.exit_code == 1


def test_every_file_of_a_run_is_written_through_the_seam(tmp_path, monkeypatch) -> None:
    """A writer that went around kvprobe.disk would leave a file the fake disk never saw."""
    disk = FullDisk(tmp_path / "run")
    full, _, _, out, _ = full_then_resume(tmp_path, monkeypatch, disk, NEEDLE_TOML, trio, "capacity,needle")
    assert full.exit_code == 1, full.output
    on_disk = {str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()}
    assert on_disk - disk.written == set()
    assert {"events.jsonl", "verdict.json.sig", "needle/heatmap-int8.png", "plots/capacity.png"} <= on_disk


# -- the seam itself --------------------------------------------------------------------------------

def test_an_append_the_disk_cuts_short_is_cut_back_and_the_next_one_is_whole(tmp_path, monkeypatch) -> None:
    run = RunDir.create(tmp_path / "run")
    run.event("a", n=1)
    before = (run.path / "events.jsonl").read_bytes()
    disk = FullDisk(run.path, capacity=10)  # 10 bytes of the next line fit, then the disk is full
    monkeypatch.setattr(os, "write", disk.write)
    with pytest.raises(DiskError, match=r"events.jsonl: No space left on device$"):
        run.event("a", n=2, payload="x" * 100)
    assert (run.path / "events.jsonl").read_bytes() == before
    disk.free()
    run.event("a", n=3)
    assert [e["n"] for e in run.events("a")] == [1, 3]


def test_a_refused_file_keeps_its_old_content_and_leaves_no_temporary(tmp_path, monkeypatch) -> None:
    target = tmp_path / "verdict.json"
    write_atomic(target, b"old")
    monkeypatch.setattr(os, "write", FullDisk(tmp_path, capacity=2).write)
    with pytest.raises(DiskError) as caught:
        write_atomic(target, b"new and longer")
    assert str(caught.value) == f"cannot write {target}: No space left on device"
    assert caught.value.exit_code == 2 and target.read_bytes() == b"old" and list(tmp_path.iterdir()) == [target]
    with pytest.raises(DiskError):
        append_line(tmp_path / "events.jsonl", b"{}\n")
    assert (tmp_path / "events.jsonl").read_bytes() == b""


def test_a_full_disk_met_by_a_library_is_exit_2_not_a_bug(tmp_path, monkeypatch) -> None:
    """lm-eval or a tokenizer cache writing past kvprobe.disk: the guard still gives the one line,
    and a probe does not mistake it for the server failing."""
    def full(config, run, *args, **kw):
        run.write_json("run.json", {})
        raise OSError(errno.ENOSPC, "No space left on device", "/root/.cache/huggingface/x.lock")

    assert not is_server_failure(OSError(errno.ENOSPC, "No space left on device"))
    assert is_server_failure(ConnectionResetError(errno.ECONNRESET, "reset"))
    monkeypatch.setattr(evaluation, "run_eval_sync", full)
    (tmp_path / "servers.toml").write_text(SERVERS_TOML)
    out = tmp_path / "run"
    result = CliRunner().invoke(cli.main, ["eval", "--servers", str(tmp_path / "servers.toml"), "--out", str(out)])
    assert result.exit_code == 2
    assert errors(result) == [f"error: cannot write /root/.cache/huggingface/x.lock: No space left on device; "
                              f"what was measured is in {out}"]
    assert not (out / "crash.txt").exists()


def test_a_real_tiny_filesystem(tmp_path, clean) -> None:
    """The same on a 192 KiB tmpfs (its own mount namespace, as an unprivileged user may make one),
    grown to 16 MiB before the resume: the kernel's ENOSPC, not a fake one."""
    if not shutil.which("unshare") or subprocess.run(["unshare", "-rm", "true"], capture_output=True).returncode:
        pytest.skip("no unshare -rm here (user namespaces off): no private tmpfs")
    disk = tmp_path / "disk"
    disk.mkdir()
    (tmp_path / "servers.toml").write_text(NEEDLE_TOML)
    helper = [shlex.quote(sys.executable), shlex.quote(str(Path(__file__).parent / "tiny_disk_run.py")),
              shlex.quote(str(tmp_path / "servers.toml")), shlex.quote(str(disk / "run"))]
    script = (f"mount -t tmpfs -o size=192k tmpfs {shlex.quote(str(disk))} && {' '.join(helper)} fresh && "
              f"mount -o remount,size=16m {shlex.quote(str(disk))} && {' '.join(helper)} resume")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(cli.__file__).parents[2]),
                                                        os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(["unshare", "-rm", "sh", "-c", script], capture_output=True, text=True, env=env,
                          timeout=300)
    if "mount:" in done.stderr:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    first, second = (orjson.loads(line) for line in done.stdout.splitlines()[-2:])
    assert first["exit"] == 2 and not first["traceback"] and first["events_whole"], first
    (line,) = first["errors"]
    assert re.fullmatch(rf"error: cannot write {re.escape(str(disk / 'run'))}/\S+: No space left on device: free "
                        r"space and finish it with `kvprobe eval --servers \S+ --resume \S+`", line), line
    assert second["exit"] == clean["needle"][0] and second["decisions"] == clean["needle"][1], second
    assert second["events_whole"] and second["events"] >= first["events"]


def test_report_on_a_full_disk_says_to_run_it_again(tmp_path, monkeypatch) -> None:
    servers, out = tmp_path / "servers.toml", tmp_path / "run"
    servers.write_text(NEEDLE_TOML)
    assert kvprobe_eval(monkeypatch, trio(), "--servers", str(servers), "--out", str(out),
                        "--probes", "capacity,needle").exit_code == 1
    monkeypatch.setattr(os, "write", FullDisk(out, at="report.html").write)
    result = CliRunner().invoke(cli.main, ["report", str(out)])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert errors(result) == [f"error: cannot write {out / 'report.html'}: No space left on device: free space and "
                              f"run `kvprobe report {out}` again"]
