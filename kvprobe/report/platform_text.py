"""A server's platform as the operator reads it: one line for tables, one shape for JSON."""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

from kvprobe.server.platform import Platform

NOT_EXPOSED = "platform not exposed"


def _gpus(models: str) -> str:
    """collect_env lists one `GPU n: name` line per device; eight identical lines read as `8x name`."""
    names = Counter(re.sub(r"^GPU \d+:\s*", "", line.strip()) for line in models.splitlines() if line.strip())
    return ", ".join(name if n == 1 else f"{n}x {name}" for name, n in names.items())


def platform_text(platform: Platform | None) -> str:
    """`AMD EPYC (25/17) avx2 avx512f`, then the GPUs if any; a missing fact reads `?`."""
    if platform is None:
        return NOT_EXPOSED
    cpu = platform.cpu_model or "CPU ?"
    if platform.cpu_family is not None or platform.cpu_model_number is not None:
        family, model = (("?" if x is None else str(x)) for x in (platform.cpu_family, platform.cpu_model_number))
        cpu += f" ({family}/{model})"
    isa = "ISA ?" if platform.isa is None else " ".join(platform.isa) or "no AVX2/AVX-512/AMX"
    parts = [f"{cpu} {isa}"]
    if platform.nvidia_gpu_models:
        # The CUDA runtime is reported even by CPU-only builds; it only says something next to a GPU.
        # Run-on (GPU, its architecture, driver, runtime) beside compiled-for (torch's CUDA, the build's archs).
        cc = platform.compute_capability
        gpus = _gpus(platform.nvidia_gpu_models) + (f" sm_{cc.replace('.', '')}" if cc else "")
        versions = [f"{label} {value}" for label, value in (
            ("driver", platform.nvidia_driver_version), ("CUDA", platform.cuda_runtime_version and
                                                         f"{platform.cuda_runtime_version} runtime"),
            ("compiled for CUDA", platform.cuda_compiled_version),
            ("kernels for", platform.cuda_archs and ";".join(f"sm_{a.replace('.', '')}" for a in platform.cuda_archs)),
        ) if value]
        parts.append(gpus + (f" ({', '.join(versions)})" if versions else ""))
    return "; ".join(parts)


def platform_json(platform: Platform | None) -> dict[str, Any]:
    """`platform` (the facts, or null) and `platform_note` (null, or why there are no facts)."""
    return {"platform": platform.to_dict() if platform else None,
            "platform_note": None if platform else NOT_EXPOSED}


def recorded_platform_text(platforms: dict[str, Any], name: str) -> str:
    """A platform the one-knob check recorded (verdict `pin.platforms`); `-` for a server it did not compare."""
    if name not in platforms:
        return "-"
    return platform_text(Platform.from_dict(platforms[name]))


# Words a GPU's marketing name carries that do not tell two GPUs apart in a fleet table (the full
# name is in --json): vendor and product-line words, memory size, form factor.
_GPU_NOISE = re.compile(r"^(NVIDIA|GeForce|Tesla|Quadro|\d+GB|HBM\w*|PCIe|SXM\w*|NVL\w*|MIG\S*|Graphics)$", re.I)
_CPU_LINES = ("EPYC", "Ryzen", "Threadripper", "Xeon", "Core", "Neoverse", "Graviton", "Ampere")


def _gpu_short(name: str) -> str:
    words = [w for w in re.split(r"[\s-]+", name) if w and not _GPU_NOISE.match(w)]
    return " ".join(words[:3]) or name


def _isa_level(isa: list[str] | None) -> str:
    """The highest kernel path the flags allow: what picks vLLM's CPU kernels."""
    if isa is None:
        return "ISA ?"
    if any(f.startswith("amx") for f in isa):
        return "AMX"
    if "avx512f" in isa:
        return "AVX-512"
    return "AVX2" if "avx2" in isa else "no AVX2"


def platform_short(platform: Platform | None) -> str:
    """`EPYC 25/1 AVX2`, `Xeon 6/167 AMX`, `H200 CUDA 13.0`: a fleet table's cell, which must fit beside
    ten others; platform_text (and --json) keep every fact. A GPU server is named by its GPUs only."""
    if platform is None:
        return "not exposed"
    if platform.nvidia_gpu_models:
        names = Counter(_gpu_short(re.sub(r"^GPU \d+:\s*", "", line.strip()))
                        for line in platform.nvidia_gpu_models.splitlines() if line.strip())
        gpus = ", ".join(name if n == 1 else f"{n}x {name}" for name, n in names.items())
        # compiled-for first: two servers on one runtime can still carry different builds
        cuda = platform.cuda_compiled_version or ".".join((platform.cuda_runtime_version or "").split(".")[:2])
        return f"{gpus} CUDA {cuda}" if cuda else gpus
    model = platform.cpu_model or ""
    line = next((w for w in _CPU_LINES if re.search(rf"\b{w}\b", model)), None)
    if line is None:
        words = [w for w in re.sub(r"\((R|TM|tm)\)", "", model).split() if w not in ("AMD", "Intel", "CPU")]
        line = words[0][:12] if words else "CPU ?"
    parts = [line]
    if platform.cpu_family is not None or platform.cpu_model_number is not None:
        parts.append("/".join("?" if x is None else str(x) for x in (platform.cpu_family, platform.cpu_model_number)))
    parts.append(_isa_level(platform.isa))
    return " ".join(parts)
