"""What a server's kernels were chosen for and what they run on: CPU model and the ISA flags vLLM
dispatches on; for a GPU, the CUDA torch was compiled for beside the runtime, the driver, the GPU model,
its compute capability and the architectures the vLLM build carries kernels for.

A wheel built for one machine runs on another with different kernels (AVX2 instead of AVX-512, no
AMX; a CUDA build without kernels for the GPU's architecture), so two servers on different platforms
are not one knob apart even when every setting matches. Compiled-for is not run-on. Read from
/server_info's `system_env` (dev mode only); only these few facts are kept, never the whole lscpu text,
flags list or pip list.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any

from kvprobe.errors import Unreadable
from kvprobe.server.untrusted import number

# The flags vLLM's CPU backend picks kernels by (AVX-512 vs AVX2 builds, the bf16/VNNI paths, AMX);
# the other hundred-odd flags change nothing kvprobe measures.
KERNEL_FLAGS = frozenset({"avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_tile", "amx_int8"})

# Free text from a remote server: bounded so a garbage reply cannot bloat the inventory.
_MAX_TEXT = 200


@dataclass
class Platform:
    cpu_model: str | None = None  # lscpu "Model name"
    cpu_family: int | None = None  # lscpu "CPU family"
    cpu_model_number: int | None = None  # lscpu "Model"
    isa: list[str] | None = None  # sorted KERNEL_FLAGS present; None: no Flags line to read
    nvidia_gpu_models: str | None = None
    nvidia_driver_version: str | None = None
    cuda_runtime_version: str | None = None  # also reported by CPU-only builds (torch's own libraries)
    cuda_compiled_version: str | None = None  # the CUDA torch was built for (None on a CPU build)
    cuda_available: bool | None = None  # torch saw a GPU
    cuda_archs: list[str] | None = None  # vllm_build_flags "CUDA Archs: 9.0a;10.0": what the kernels were built for

    @property
    def device(self) -> str | None:
        """"cuda", "cpu", or None when the server did not say."""
        if self.cuda_available or self.nvidia_gpu_models:
            return "cuda"
        return "cpu" if self.cuda_available is False or self.cpu_model else None

    @property
    def compute_capability(self) -> str | None:
        """The first GPU's compute capability, from its model name (collect_env does not report it)."""
        return compute_capability(self.nvidia_gpu_models)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Any) -> Platform | None:
        """The inverse of to_dict; anything that is not a platform object (null, garbage) is None."""
        if not isinstance(data, dict):
            return None
        isa = data.get("isa")
        return cls(
            cpu_model=_text(data.get("cpu_model")),
            cpu_family=_int(data.get("cpu_family")),
            cpu_model_number=_int(data.get("cpu_model_number")),
            isa=sorted({f for f in isa if isinstance(f, str) and f in KERNEL_FLAGS}) if isinstance(isa, list) else None,
            nvidia_gpu_models=_text(data.get("nvidia_gpu_models")),
            nvidia_driver_version=_text(data.get("nvidia_driver_version")),
            cuda_runtime_version=_text(data.get("cuda_runtime_version")),
            cuda_compiled_version=_text(data.get("cuda_compiled_version")),
            cuda_available=data.get("cuda_available") if isinstance(data.get("cuda_available"), bool) else None,
            cuda_archs=_archs(data.get("cuda_archs")),
        )


def _archs(value: Any) -> list[str] | None:
    if not isinstance(value, list):
        return None
    return [a for a in (_text(v) for v in value[:64]) if a] or None


def _text(value: Any) -> str | None:
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        return None
    text = str(value).strip()
    return text[:_MAX_TEXT] or None


def _int(value: Any) -> int | None:
    try:
        return number(value, "platform", integer=True, minimum=0, maximum=2**31, text=True)
    except Unreadable:  # missing or garbled: the fact is unknown, and then not compared
        return None


def _lscpu_fields(text: str) -> dict[str, str]:
    """`Key:   value` lines; the first of each key wins (hybrid ARM parts list one block per cluster)."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            out.setdefault(key.strip(), value.strip())
    return out


def platform_from_system_env(system: Any) -> Platform:
    """Platform facts from /server_info's `system_env`; what is missing or unreadable is None."""
    system = system if isinstance(system, dict) else {}
    cpu_info = system.get("cpu_info")
    lscpu = _lscpu_fields(cpu_info) if isinstance(cpu_info, str) else {}
    flags = lscpu.get("Flags")
    return Platform(
        cpu_model=_text(lscpu.get("Model name")),
        cpu_family=_int(lscpu.get("CPU family")),
        cpu_model_number=_int(lscpu.get("Model")),
        isa=None if flags is None else sorted(KERNEL_FLAGS.intersection(flags.split())),
        nvidia_gpu_models=_text(system.get("nvidia_gpu_models")),
        nvidia_driver_version=_text(system.get("nvidia_driver_version")),
        cuda_runtime_version=_text(system.get("cuda_runtime_version")),
        cuda_compiled_version=_text(system.get("cuda_compiled_version")),
        cuda_available=_bool(system.get("is_cuda_available")),
        cuda_archs=build_cuda_archs(system.get("vllm_build_flags")),
    )


def _bool(value: Any) -> bool | None:
    """collect_env writes booleans as "True"/"False"."""
    if isinstance(value, bool):
        return value
    return {"true": True, "false": False}.get(str(value).strip().lower()) if isinstance(value, str) else None


def build_cuda_archs(flags: Any) -> list[str] | None:
    """`CUDA Archs: 9.0a;10.0+PTX; ROCm: Disabled` -> ["9.0a", "10.0+PTX"]; "Not Set" or absent -> None."""
    if not isinstance(flags, str):
        return None
    match = re.search(r"CUDA Archs:\s*([^;]*(?:;\s*[0-9][^;]*)*)", flags)
    if not match or match.group(1).strip().lower() in ("", "not set", "none"):
        return None
    archs = [a.strip() for a in re.split(r"[;\s,]+", match.group(1)) if re.match(r"^\d+\.\d+", a.strip())]
    return archs[:64] or None


# Compute capability by GPU name (NVIDIA's CUDA GPUs table); the first pattern that matches wins.
_CAPABILITY = (
    (r"\bGB10\b", "12.1"), (r"RTX 50\d\d|RTX PRO \d+ Blackwell", "12.0"),
    (r"\bG?B300\b", "10.3"), (r"\bG?B200\b", "10.0"),
    (r"\bGH200\b|\bH100\b|\bH200\b|\bH800\b|\bH20\b", "9.0"),
    (r"\bL4\b|\bL40S?\b|\bL20\b|RTX 40\d\d|RTX \d+ Ada", "8.9"),
    (r"\bA100\b|\bA800\b|\bA30\b", "8.0"),
    (r"\bA10G?\b|\bA40\b|\bA16\b|\bA2\b|RTX 30\d\d|RTX A\d+", "8.6"),
    (r"\bT4\b|RTX 20\d\d", "7.5"), (r"\bV100\b", "7.0"),
)


def compute_capability(gpu_models: str | None) -> str | None:
    """The compute capability of the first GPU collect_env lists (`GPU 0: NVIDIA H200`); None if unknown."""
    if not gpu_models:
        return None
    first = re.sub(r"^GPU \d+:\s*", "", gpu_models.strip().splitlines()[0]).strip()
    return next((cc for pattern, cc in _CAPABILITY if re.search(pattern, first)), None)


def arch_mismatch(platform: Platform | None) -> str | None:
    """"built for sm_90a, running on sm_120" when the vLLM build has no kernels for this GPU's architecture.

    An arch-specific entry (9.0a) runs on that exact capability only; a family entry (10.0f) on the same
    major; a +PTX entry on that capability and newer (JIT-compiled). None when it fits or is not known."""
    if platform is None or not platform.cuda_archs or platform.device != "cuda":
        return None
    running = platform.compute_capability
    if running is None:
        return None
    major, minor = (int(x) for x in running.split("."))

    def runs(arch: str) -> bool:
        m = re.match(r"^(\d+)\.(\d+)([af]?)(\+PTX)?$", arch)
        if not m:
            return True  # an entry we cannot read is not evidence of a mismatch
        a_major, a_minor, suffix, ptx = int(m.group(1)), int(m.group(2)), m.group(3), m.group(4)
        if (a_major, a_minor) == (major, minor):
            return True
        if suffix == "f" and a_major == major and a_minor <= minor:
            return True
        return bool(ptx) and not suffix and (a_major, a_minor) <= (major, minor)

    if any(runs(a) for a in platform.cuda_archs):
        return None
    built = ";".join("sm_" + a.replace(".", "") for a in platform.cuda_archs)
    return f"built for {built}, running on sm_{running.replace('.', '')}"


def platform_facts(platform: Platform) -> dict[str, Any]:
    """The platform as `platform.<field>` facts for the one-knob check."""
    return {f"platform.{name}": value for name, value in platform.to_dict().items()}
