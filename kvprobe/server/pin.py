"""The one-knob check: do the servers differ only in the knob under test (by default the KV-cache dtype)?

A comparison whose servers differ in anything else (max_model_len, memory, version, prefix caching)
is a moving baseline, not a result. Each candidate is compared with the reference.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kvprobe import knob as knobs
from kvprobe.server.inventory import NOT_TAKEN, Inventory
from kvprobe.server.platform import Platform, platform_facts


@dataclass
class Difference:
    field: str
    values: dict[str, Any]

    @property
    def text(self) -> str:
        return f"{self.field}: " + " ".join(f"{name}={_show(value)}" for name, value in self.values.items())

    def to_dict(self) -> dict[str, Any]:
        return {"field": self.field, "values": self.values, "text": self.text}


def _show(value: Any) -> str:
    # A list (platform.isa) as one space-free word: the text separates servers by spaces.
    if isinstance(value, list):
        return ",".join(map(str, value)) or "(none)"
    return str(value)


@dataclass
class PinCheck:
    valid: bool
    differences: dict[str, list[Difference]] = field(default_factory=dict)  # candidate -> differences
    unchecked: list[str] = field(default_factory=list)
    # The platform of every server compared (None: not exposed), kept so a report shows what was compared.
    platforms: dict[str, Platform | None] = field(default_factory=dict)
    knob: str = knobs.DEFAULT
    # Each server's value of the knob, from its own cache_config_info (None: the label is not there).
    knob_values: dict[str, Any] = field(default_factory=dict)
    # Each server's attention backend as "FLASH_ATTN (declared)", or NOT_EXPOSED: never assumed the same.
    # Not a difference: a KV dtype picks its backend (FlashAttention takes no per-token-head formats), so
    # the comparison measures dtype and backend together, and the operator should see both.
    attention_backends: dict[str, str] = field(default_factory=dict)

    def candidate_valid(self, name: str) -> bool:
        return not self.differences.get(name)

    def all_differences(self) -> list[Difference]:
        return [d for diffs in self.differences.values() for d in diffs]

    def to_dict(self) -> dict[str, Any]:
        return {
            "valid": self.valid,
            "differences": [d.to_dict() for d in self.all_differences()],
            "by_candidate": {k: [d.to_dict() for d in v] for k, v in self.differences.items()},
            "unchecked": self.unchecked,
            "platforms": {k: p.to_dict() if p else None for k, p in self.platforms.items()},
            "knob": self.knob,
            "knob_label": knobs.label_of(self.knob),
            "knob_values": self.knob_values,
            "attention_backends": self.attention_backends,
        }


# /server_info keys that differ between two identically configured servers.
_ENGINE_VOLATILE = frozenset({
    "vllm_config.instance_id",
    "vllm_env.VLLM_OBJECT_STORAGE_SHM_BUFFER_NAME",
    "vllm_env.VLLM_PORT",
    "vllm_env.VLLM_DP_MASTER_PORT",
})


# /server_info keys that repeat a fact compared anyway (one difference, named once).
_ENGINE_COVERED = frozenset({
    "vllm_config.model_config.max_model_len",
    "system.vllm_version",
})


# Environment variables that name where a server keeps files or how it is reached: they differ between
# hosts and users without changing a number the server computes.
_LOCAL_ENV_SUFFIXES = ("_ROOT", "_CACHE", "_CACHE_PATH", "_DIR", "_PATH", "_IP", "_HOST", "_PORT", "_BUFFER_NAME")


def _engine_key_allowed(key: str, free: frozenset[str], knob_key: str | None = None) -> bool:
    if key in _ENGINE_VOLATILE or key in _ENGINE_COVERED or key == knob_key:
        return True
    if key.startswith("vllm_env.") and key.endswith(_LOCAL_ENV_SUFFIXES):
        return True
    prefix = "vllm_config.cache_config."
    return key.startswith(prefix) and key[len(prefix):] in free


def _fingerprint_build(fp: str | None) -> str | None:
    """`vllm-<ver>[-tpN][-ppN][-dpN][-ep]-<hash8>`: the hash covers cache_dtype, so drop it."""
    if not fp:
        return None
    head, _, _ = fp.rpartition("-")
    return head or fp


def _facts(inv: Inventory, free: frozenset[str], knob_key: str | None = None) -> dict[str, Any]:
    facts: dict[str, Any] = {
        "version": inv.version,
        "model_root": inv.model_root,
        "max_model_len": inv.max_model_len,
    }
    if (build := _fingerprint_build(inv.system_fingerprint)) is not None:
        facts["fingerprint"] = build
    labels = inv.cache_config or {}
    for label, value in labels.items():
        if label not in free:
            facts[f"cache_config.{label}"] = value
    for key, value in (inv.server_info or {}).items():
        # A cache setting /metrics already shows is compared there: one difference, named once.
        if key.startswith("vllm_config.cache_config.") and key.rpartition(".")[2] in labels:
            continue
        if not _engine_key_allowed(key, free, knob_key):
            facts[f"server_info.{key}"] = value
    if inv.platform is not None:
        facts.update(platform_facts(inv.platform))
    return facts


# Read from lscpu text, where None means "could not read", not a value: never compared. The NVIDIA
# facts are None on a machine without a GPU, a value like any other.
_CPU_FACTS = frozenset({"platform.cpu_model", "platform.cpu_family", "platform.cpu_model_number", "platform.isa"})


def _comparable(key: str, reference: Inventory, cand: Inventory, ref: dict[str, Any], facts: dict[str, Any],
                unchecked: list[str]) -> bool:
    """Whether `key` can be compared; what cannot be is noted in `unchecked`, never taken as the same."""
    if key == "fingerprint":
        return key in ref and key in facts  # only known after a successful smoke
    section = key.partition(".")[0]
    if section in ("cache_config", "server_info", "platform") and (
            getattr(reference, section) is None or getattr(cand, section) is None):
        return False  # noted once per server by check_pin
    if key in _CPU_FACTS:
        unknown = [inv.name for inv, f in ((reference, ref), (cand, facts)) if f.get(key) is None]
        unchecked += [f"{name}: {key} not in its /server_info cpu_info, not compared" for name in unknown]
        return not unknown
    return True


def _knob_value(inv: Inventory, knob: str, unchecked: list[str]) -> Any:
    """The server's own value of the knob; a missing label is said, not guessed."""
    if (key := knobs.engine_key(knob)) is not None:
        if inv.server_info is None:
            unchecked.append(f"{inv.name}: its {knob} is not exposed (MambaConfig is only in /server_info, which "
                             "needs VLLM_SERVER_DEV_MODE=1)")
            return None
        if key not in inv.server_info:
            unchecked.append(f"{inv.name}: no {key} in its /server_info, so its {knob} is not known")
        return inv.server_info.get(key)
    label = knobs.label_of(knob)
    value = (inv.cache_config or {}).get(label)
    if value is None and inv.cache_config is not None:
        unchecked.append(f"{inv.name}: no {label!r} label in its vllm:cache_config_info, so its {knob} is not known")
    return value


NOT_EXPOSED = "not exposed"


def backend_text(inv: Inventory) -> str:
    if not inv.attention_backend:
        return NOT_EXPOSED
    return f"{inv.attention_backend} ({inv.attention_backend_source})"


def _hybrid(inv: Inventory) -> bool:
    """A model with Mamba state: its cache_config_info reports a Mamba block (dense models report none)."""
    return (inv.cache_config or {}).get("mamba_block_size") not in (None, "None", "")


def check_pin(reference: Inventory, candidates: list[Inventory], knob: str = knobs.DEFAULT) -> PinCheck:
    """Compare each reachable candidate with the reference on every setting except `knob` and the labels
    that follow from it."""
    free, knob_key = knobs.free_labels(knob), knobs.engine_key(knob)
    result = PinCheck(valid=True, knob=knob)
    result.knob_values[reference.name] = _knob_value(reference, knob, result.unchecked)
    ref = _facts(reference, free, knob_key)
    for cand in candidates:
        if cand.status in NOT_TAKEN:
            result.unchecked.append(f"{cand.name}: not inventoried ({cand.status}), not compared")
            continue
        facts = _facts(cand, free, knob_key)
        result.knob_values[cand.name] = _knob_value(cand, knob, result.unchecked)
        diffs = []
        for key in sorted(set(ref) | set(facts)):
            if _comparable(key, reference, cand, ref, facts, result.unchecked) and ref.get(key) != facts.get(key):
                diffs.append(Difference(key, {reference.name: ref.get(key), cand.name: facts.get(key)}))
        result.differences[cand.name] = diffs
        for inv in (reference, cand):
            result.platforms[inv.name] = inv.platform
            result.attention_backends[inv.name] = backend_text(inv)
            if inv.cache_config is None:
                result.unchecked.append(f"{inv.name}: no vllm:cache_config_info, cache settings not compared")
            if inv.server_info is None:
                result.unchecked.append(f"{inv.name}: no /server_info (VLLM_SERVER_DEV_MODE=1 shows it), "
                                        "engine settings beyond /metrics not compared"
                                        + (" (MambaConfig: mamba backend, stochastic rounding: not exposed)"
                                           if _hybrid(inv) else ""))
            elif inv.platform is None:
                result.unchecked.append(f"{inv.name}: no platform facts, CPU and GPU platform not compared")
    result.unchecked = sorted(set(result.unchecked))
    result.valid = not result.all_differences()
    return result


