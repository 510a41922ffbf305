"""The declared knob: the one-knob check lets exactly that setting (and what follows from it) differ.

The SSM-state candidate's /metrics is derived from the real hybrid capture (metrics-auto-maxlen512):
its labels are changed to what the real `--mamba-ssm-cache-dtype float16` server reported (issue 13:
149,796 tokens, attention block 256); everything else is the capture's bytes.
"""

from __future__ import annotations

import re

import pytest
from replay import capture

from kvprobe import knob
from kvprobe.config import parse_config
from kvprobe.errors import ConfigError
from kvprobe.server.inventory import Inventory
from kvprobe.server.metrics import parse_metrics
from kvprobe.server.pin import check_pin


def hybrid_text(ssm: str = "float32", kv: str = "auto") -> str:
    text = capture("hybrid-nemotronh", "metrics-auto-maxlen512").decode()
    changes = {"cache_dtype": ("auto", kv)}
    if ssm != "float32":
        changes |= {"mamba_ssm_cache_dtype": ("float32", ssm), "kv_cache_size_tokens": ("80659", "149796"),
                    "block_size": ("512", "256"), "effective_attention_block_size": ("512", "256")}
    for label, (old, new) in changes.items():
        text, n = re.subn(rf'(?<![a-z_]){label}="{old}"', f'{label}="{new}"', text)
        assert n == 1, label
    return text


def inv(name: str, text: str) -> Inventory:
    snap = parse_metrics(text)
    return Inventory(name=name, url="http://x", version="0.32.0", model_root="/models/h", max_model_len=512,
                     cache_config=snap.cache_config, capacity=snap.capacity())


def test_ssm_state_pair_is_invalid_under_the_default_knob_naming_the_label() -> None:
    pin = check_pin(inv("auto", hybrid_text()), [inv("ssm16", hybrid_text("float16"))])
    assert not pin.valid
    assert [d.text for d in pin.all_differences()] == ["cache_config.mamba_ssm_cache_dtype: auto=float32 ssm16=float16"]


def test_ssm_state_pair_is_valid_when_that_knob_is_declared() -> None:
    pin = check_pin(inv("auto", hybrid_text()), [inv("ssm16", hybrid_text("float16"))], "mamba_ssm_cache_dtype")
    assert pin.valid, pin.all_differences()
    data = pin.to_dict()
    assert data["knob"] == "mamba_ssm_cache_dtype"
    assert data["knob_values"] == {"auto": "float32", "ssm16": "float16"}  # read from the servers' labels


def test_declared_knob_and_a_second_setting_is_invalid() -> None:
    pin = check_pin(inv("auto", hybrid_text()), [inv("both", hybrid_text("float16", kv="fp8"))],
                    "mamba_ssm_cache_dtype")
    assert [d.text for d in pin.all_differences()] == ["cache_config.cache_dtype: auto=auto both=fp8"]


def test_prefix_caching_is_not_a_following_label() -> None:
    off = hybrid_text("float16").replace('enable_prefix_caching="True"', 'enable_prefix_caching="False"')
    pin = check_pin(inv("auto", hybrid_text()), [inv("ssm16", off)], "mamba_ssm_cache_dtype")
    assert {d.field for d in pin.all_differences()} == {"cache_config.enable_prefix_caching"}


def test_an_undeclared_label_knob_is_allowed_and_a_missing_label_is_said() -> None:
    a, b = inv("a", hybrid_text()), inv("b", hybrid_text())
    pin = check_pin(a, [b], "no_such_label")
    assert pin.valid and pin.knob_values == {"a": None, "b": None}
    said = "a: no 'no_such_label' label in its vllm:cache_config_info, so its no_such_label is not known"
    assert said in pin.unchecked


def test_the_conv_state_knob_lets_the_resolved_ssm_label_follow() -> None:
    assert "mamba_ssm_cache_dtype" in knob.free_labels("mamba_cache_dtype")
    assert "cache_dtype" not in knob.free_labels("mamba_ssm_cache_dtype")
    assert knob.flag("mamba_ssm_cache_dtype") == "--mamba-ssm-cache-dtype"
    assert knob.label_of("kv_cache_dtype") == "cache_dtype"


def test_config_knob_default_and_validation() -> None:
    servers = [{"name": "a", "url": "http://127.0.0.1:1", "role": "reference"}, {"name": "b", "url": "http://127.0.0.1:2"}]
    assert parse_config({"server": servers}).knob == "kv_cache_dtype"
    assert parse_config({"knob": "mamba_ssm_cache_dtype", "server": servers}).knob == "mamba_ssm_cache_dtype"
    with pytest.raises(ConfigError) as err:
        parse_config({"knob": "Mamba SSM", "server": servers})
    assert err.value.problems == ["servers.toml: knob: use a vLLM setting's name in lower case with underscores, "
                                  "e.g. kv_cache_dtype"]


def test_a_slip_of_a_known_name_is_caught_and_other_labels_are_left_to_the_servers() -> None:
    assert knob.near_miss("kv_cache_dtyp") == "kv_cache_dtype"
    assert knob.near_miss("kvcache_dtype") == "kv_cache_dtype"
    assert knob.near_miss("mamba_ssm_cache_dtyp") == "mamba_ssm_cache_dtype"
    assert knob.near_miss("cache_dtyp") == "cache_dtype"  # a label's name
    for name in ("kv_cache_dtype", "cache_dtype", "mamba_backend", "block_size"):  # known: no slip
        assert knob.near_miss(name) is None
    for name in ("no_such_label", "kv_cache_dtype_v2", "attention_sink_dtype"):  # far from every known name
        assert knob.near_miss(name) is None
