"""What a server's kernels were chosen for: CPU model, the ISA flags vLLM dispatches on, GPU facts.

A wheel built for one machine runs on another with different kernels (AVX2 instead of AVX-512, no
AMX), so two servers on different ISAs are not one knob apart even when every setting matches. Read
from /server_info's `system_env` (dev mode only); only these few facts are kept, never the whole
lscpu text or flags list.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from kvprobe.untrusted import Unreadable, number

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
    cuda_runtime_version: str | None = None

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
        )


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
    )


def platform_facts(platform: Platform) -> dict[str, Any]:
    """The platform as `platform.<field>` facts for the one-knob check."""
    return {f"platform.{name}": value for name, value in platform.to_dict().items()}
