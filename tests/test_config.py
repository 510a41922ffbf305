from __future__ import annotations

from pathlib import Path

import pytest

from kvprobe.config import load_config, parse_config, shared_urls, unset_keys
from kvprobe.errors import ConfigError

GOOD = """
[bars]
perplexity_delta_max = 0.02

[[server]]
name = "bf16"
url = "http://127.0.0.1:8101/v1"
role = "reference"

[[server]]
name = "fp8"
url = "http://127.0.0.1:8102"
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "servers.toml"
    path.write_text(text)
    return path


def problems(tmp_path: Path, text: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, text))
    return info.value.problems


def test_good_config_defaults_and_roles(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, GOOD))
    assert config.reference.name == "bf16"
    assert [s.name for s in config.candidates] == ["fp8"]
    assert config.bars.perplexity_delta_max == 0.02
    assert config.bars.capacity_gain_min == 0.05  # default
    assert config.reference.url == "http://127.0.0.1:8101"  # /v1 suffix accepted and dropped
    assert config.candidates[0].role == "candidate"


def test_example_servers_toml_in_repo_is_valid() -> None:
    config = load_config(Path(__file__).parents[1] / "servers.toml")
    assert config.reference.name == "auto"
    assert {s.name for s in config.candidates} == {"fp8", "int8_per_token_head"}


def test_broken_toml_is_one_line_naming_the_file(tmp_path: Path) -> None:
    (line,) = problems(tmp_path, "[[server]\nname=1")
    assert "servers.toml" in line and "not valid TOML" in line


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path / "nope.toml")
    assert "cannot read" in info.value.problems[0]


def test_unknown_key_is_named(tmp_path: Path) -> None:
    (line,) = problems(tmp_path, GOOD + 'colour = "blue"\n')
    assert "server[1].colour" in line and "unknown key" in line


def test_unknown_bar_is_named(tmp_path: Path) -> None:
    (line,) = problems(tmp_path, GOOD.replace("perplexity_delta_max", "perplexity_delta_maxx"))
    assert "bars.perplexity_delta_maxx" in line


def test_a_misspelled_key_says_did_you_mean(tmp_path: Path) -> None:
    (line,) = problems(tmp_path, GOOD.replace("perplexity_delta_max", "perplexity_delta_mx"))
    assert line == (f"{tmp_path / 'servers.toml'}: bars.perplexity_delta_mx: unknown key: did you mean "
                    "'perplexity_delta_max'?")
    (line,) = problems(tmp_path, GOOD.replace("[[server]]", "[[servers]]", 1).replace("[[server]]", "[[servers]]"))
    assert line.endswith("servers: unknown key: did you mean 'server'?")  # server itself is then not "missing"
    (line,) = problems(tmp_path, GOOD + 'colour = "blue"\n')
    assert line.endswith("server[1].colour: unknown key: remove it ([[server]] takes name, url, role, api_key_env, "
                         "timeout_s, headers, model, tokenizer, attention_backend)")


def test_an_api_key_in_the_file_gets_the_environment_advice_and_is_never_shown(tmp_path: Path) -> None:
    secret = "sk-live-in-the-file-93f1"
    (line,) = problems(tmp_path, GOOD + f'api_key = "{secret}"\n')
    assert line.startswith(f"{tmp_path / 'servers.toml'}: server[1].api_key: keys are read only from the environment")
    assert 'api_key_env = "NAME"' in line and secret not in line
    # nor in a URL, nor as the variable's name
    (line,) = problems(tmp_path, GOOD.replace("http://127.0.0.1:8102", f"http://user:{secret}@127.0.0.1:8102"))
    assert "server[1].url: credentials in the URL" in line and secret not in line
    (line,) = problems(tmp_path, GOOD + f'api_key_env = "{secret}"\n')
    assert "server[1].api_key_env: give the NAME of the environment variable" in line and secret not in line


def test_pydantic_errors_become_one_line_naming_the_key_and_the_fix(tmp_path: Path) -> None:
    where = tmp_path / "servers.toml"
    cases = {
        GOOD.replace("[bars]", '[bars]\ntask_accuracy_drop_max = "x"'):
            "bars.task_accuracy_drop_max: must be a number or a table",
        GOOD + '[load]\nendpoint = "all"\n': 'load.endpoint: must be "sweep" or a whole number',
        GOOD + "[needle]\ncount = 0\n": "needle.count: must be at least 1",
        GOOD + '[needle]\ncount = "many"\n': "needle.count: must be a whole number",
        '[server]\nname = "x"\nurl = "http://127.0.0.1:1"\n': "server: write each server as its own [[server]] "
                                                                  "table (two brackets)",
    }
    for text, said in cases.items():
        assert problems(tmp_path, text) == [f"{where}: {said}"], text
    (line,) = problems(tmp_path, GOOD.replace('role = "reference"', 'role = "gold"'))
    assert line == f'{where}: server[0].role: must be "reference" or "candidate"'


def test_duplicate_names(tmp_path: Path) -> None:
    (line,) = problems(tmp_path, GOOD.replace('name = "fp8"', 'name = "bf16"'))
    assert "server[1].name" in line and "duplicate" in line


def test_no_reference_and_two_references(tmp_path: Path) -> None:
    (line,) = problems(tmp_path, GOOD.replace('role = "reference"', 'role = "candidate"'))
    assert "exactly one" in line and "found none" in line
    (line,) = problems(tmp_path, GOOD + 'role = "reference"\n')
    assert "found bf16, fp8" in line


def test_no_candidate_is_refused(tmp_path: Path) -> None:
    (line,) = problems(tmp_path, GOOD.split('[[server]]\nname = "fp8"')[0])
    assert line == (f"{tmp_path / 'servers.toml'}: server: no candidate to compare with the reference bf16: add a "
                    '[[server]] with role = "candidate" (the default)')


def test_servers_at_one_url_are_named(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, GOOD.replace("8102", "8101/")))
    assert shared_urls(config, "s.toml") == [
        "s.toml: server[1].url: fp8 and bf16 are the same server (http://127.0.0.1:8101): a server compared with "
        "itself measures only noise; point each [[server]] at its own server"]
    assert shared_urls(load_config(write(tmp_path, GOOD))) == []


@pytest.mark.parametrize(("url", "said"), [
    ("http://10.0.0.6:80000", "port 80000 is out of range: a port is 1-65535"),
    ("http://10.0.0.6:0", "port 0 is out of range: a port is 1-65535"),
    ("http://10.0.0.6:http", "port http is not a number: a port is 1-65535"),
    ("http://h:8000/v1/chat/completions", "the path /v1/chat/completions is not part of a server's address: give "
                                          "http://h:8000 (with or without /v1): kvprobe adds the API paths itself"),
    ("https://gw.example/vllm", "the path /vllm is not part of a server's address"),
])
def test_a_url_is_a_servers_address_and_nothing_more(tmp_path: Path, url: str, said: str) -> None:
    (line,) = problems(tmp_path, GOOD.replace("http://127.0.0.1:8102", url))
    assert line.startswith(f"{tmp_path / 'servers.toml'}: server[1].url: {said}")
    for fine in ("http://127.0.0.1:8102/v1/", "https://[::1]:8443", "http://gpu-7.internal"):
        assert load_config(write(tmp_path, GOOD.replace("http://127.0.0.1:8102", fine))).candidates[0].url == \
            fine.removesuffix("/").removesuffix("/v1")


def test_a_bar_over_half_needs_allow_large_bars_or_a_spelled_out_unit(tmp_path: Path) -> None:
    where = tmp_path / "servers.toml"
    assert problems(tmp_path, GOOD.replace("0.02", "5")) == [
        f"{where}: bars.perplexity_delta_max = 5 reads as +500%: write 0.05 for 5%, or set allow_large_bars = true"]
    assert problems(tmp_path, GOOD.replace("0.02", "1\nthroughput_drop_max = 0.6")) == [
        f"{where}: bars.perplexity_delta_max = 1 reads as +100%: write 0.01 for 1%, or set allow_large_bars = true",
        f"{where}: bars.throughput_drop_max = 0.6 reads as -60%: write 0.006 for 0.6%, or set allow_large_bars = "
        "true"]
    allowed = load_config(write(tmp_path, GOOD.replace("0.02", "5\nallow_large_bars = true")))
    assert allowed.bars.perplexity_delta_max == 5
    assert "allow_large_bars" not in allowed.public_dict()["bars"]  # the verdict records the bars themselves
    spelled = load_config(write(tmp_path, GOOD.replace("0.02", '"5%"\ncapacity_gain_min = "100%"')))
    assert (spelled.bars.perplexity_delta_max, spelled.bars.capacity_gain_min) == (0.05, 1.0)


def test_bad_url_and_bad_role(tmp_path: Path) -> None:
    lines = problems(tmp_path, GOOD.replace("http://127.0.0.1:8102", "htp:/x").replace(
        'role = "reference"', 'role = "gold"'))
    assert any("server[1].url" in line and "not an http(s) URL" in line for line in lines)
    assert any("server[0].role" in line for line in lines)
    assert len(lines) == 2  # every problem reported at once


def test_an_unset_key_variable_is_a_warning_naming_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KVPROBE_TEST_KEY", raising=False)
    text = GOOD + 'api_key_env = "KVPROBE_TEST_KEY"\n'
    config = load_config(write(tmp_path, text))  # optional: a server that needs no key is measured without one
    assert config.candidates[0].unset_key_env() == "KVPROBE_TEST_KEY" and config.candidates[0].api_key() is None
    assert unset_keys(config, "s.toml") == ["s.toml: server[1].api_key_env: KVPROBE_TEST_KEY is not set, so fp8 is "
                                            "sent no API key: export it if fp8 needs one"]
    both = load_config(write(tmp_path, text.replace('role = "reference"', 'role = "reference"\napi_key_env = '
                                                                         '"KVPROBE_TEST_KEY"')))
    assert unset_keys(both, "s.toml") == ["s.toml: server[0].api_key_env: KVPROBE_TEST_KEY is not set, so bf16 and "
                                          "fp8 are sent no API key: export it if they need one"]
    monkeypatch.setenv("KVPROBE_TEST_KEY", "sk-secret")
    config = load_config(write(tmp_path, text))
    assert config.candidates[0].api_key() == "sk-secret" and unset_keys(config) == []
    assert "sk-secret" not in str(config.public_dict())


def test_secret_headers_are_refused_and_values_never_recorded(tmp_path: Path) -> None:
    (line,) = problems(tmp_path, GOOD + '[server.headers]\nAuthorization = "Bearer x"\n')
    assert "api_key_env" in line
    config = load_config(write(tmp_path, GOOD + '[server.headers]\nX-Team = "blue-team"\n'))
    assert config.candidates[0].headers == {"X-Team": "blue-team"}
    assert "blue-team" not in str(config.public_dict())


def test_parse_config_needs_a_server() -> None:
    with pytest.raises(ConfigError) as info:
        parse_config({"bars": {}})
    assert "server" in info.value.problems[0] and "missing" in info.value.problems[0]


def test_model_config_path_is_relative_to_servers_toml(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    config = load_config(write(tmp_path / "sub", 'model_config = "cfg/config.json"\n' + GOOD))
    assert config.model_config_path == str(tmp_path / "sub" / "cfg" / "config.json")


def test_task_bars_global_per_task_and_checked_against_the_task_names(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, GOOD.replace("[bars]", "[bars]\ntask_accuracy_drop_max = 0.05")))
    assert config.bars.task_bar("kvprobe_qa") == 0.05 and "tasks" not in config.model_fields_set
    tasks = '[tasks]\nnames = ["a", "b"]\n\n[bars]\ntask_accuracy_drop_max = '
    text = GOOD.replace("[bars]", tasks + "{a = 0.1, default = 0.0}")
    config = load_config(write(tmp_path, text))
    assert (config.bars.task_bar("a"), config.bars.task_bar("b")) == (0.1, 0.0)
    assert "tasks" in config.model_fields_set  # [tasks] given: the tasks probe runs by default
    bad = GOOD.replace("[bars]", tasks + "{a = 0.1, c = 0.2}")
    (one, two) = problems(tmp_path, bad)
    assert "c is not in tasks.names (a, b)" in one and "no bar for b" in two
    assert "task_accuracy_drop_max = 2 reads as -200%" in problems(
        tmp_path, GOOD.replace("[bars]", "[bars]\ntask_accuracy_drop_max = 2"))[0]
    (line,) = problems(tmp_path, GOOD.replace("[bars]", tasks + "{a = 0.1, b = 0.8}"))
    assert line.endswith("bars.task_accuracy_drop_max: b = 0.8 reads as -80%: write 0.008 for 0.8%, or set "
                         "allow_large_bars = true")
    allowed = GOOD.replace("[bars]", "[bars]\nallow_large_bars = true\ntask_accuracy_drop_max = 2")
    assert "fraction in [0, 1]" in problems(tmp_path, allowed)[0]


def test_tasks_settings_are_checked(tmp_path: Path) -> None:
    got = problems(tmp_path, GOOD + '\n[tasks]\nnames = ["a", "a"]\n')
    assert got == [f"{tmp_path / 'servers.toml'}: tasks.names: task names must be unique"]
    got = problems(tmp_path, GOOD + '\n[tasks]\nmetric = {other = "acc"}\n')
    assert "tasks.metric: other is not in tasks.names" in got[0]
    got = problems(tmp_path, GOOD + '\n[tasks]\ninclude_path = "nowhere"\n')
    assert got == [f"{tmp_path / 'servers.toml'}: tasks.include_path {tmp_path / 'nowhere'}: not a folder"]
