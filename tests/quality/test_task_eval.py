"""kvprobe.quality.task_eval without a server: which tasks load and why not, how a chat answer the
cap cut is read (a real capture: content null, the reasoning cut at max_tokens), and how a sample's
prompt is matched to the request it came from."""

from __future__ import annotations

import json

import pytest
from replay import FIXTURES

from kvprobe.corpus import TASKS_DIR
from kvprobe.errors import ConfigError, Unreadable
from kvprobe.quality import lmeval, task_eval


def test_the_shipped_task_loads_as_a_chat_task_on_exact_match() -> None:
    info = task_eval.load_task("kvprobe_qa", TASKS_DIR, False, None, None)
    assert (info.output_type, info.metric, info.higher_is_better, info.documents) == (
        "generate_until", "exact_match", True, 180)
    assert info.chat and task_eval.load_task("kvprobe_qa", TASKS_DIR, False, None, 5).documents == 5
    # The documents' digest keys resume: another limit is another set of documents.
    assert task_eval.load_task("kvprobe_qa", TASKS_DIR, False, None, 5).digest != info.digest


@pytest.mark.parametrize(("task", "metric", "says"), [
    ("no_such_task", None, "no such lm-eval task in"),
    ("kvprobe_qa", "acc", "metric 'acc' is not one of its metrics (exact_match)"),
    ("kvprobe_ppl", None, "output_type loglikelihood_rolling has no per-sample accuracy"),
])
def test_a_task_kvprobe_cannot_pair_is_one_line(task: str, metric: str | None, says: str) -> None:
    with pytest.raises(ConfigError) as info:
        task_eval.load_task(task, TASKS_DIR, False, metric, None)
    (line,) = info.value.problems
    assert line.startswith(f"tasks: {task!r}: ") and says in line


def chat_model() -> object:
    target = lmeval.Target(name="r1", url="http://127.0.0.1:9", model="m", max_length=8192,
                           tokenizer=lmeval.Tokenizer("remote"))
    return task_eval.make_chat_model(target)


def test_an_answer_cut_inside_the_reasoning_is_empty_and_marked_length() -> None:
    lm = chat_model()
    captured = json.loads((FIXTURES / "reasoning-deepseek_r1-8104" / "chat.response.json").read_text())
    assert captured["choices"][0]["message"]["content"] is None  # the capture: cut while thinking
    payload = lm._create_payload([{"role": "user", "content": "q"}], generate=True,
                                 gen_kwargs={"max_gen_toks": 16, "until": []})
    assert "seed" not in payload and payload["max_tokens"] == 16 and payload["temperature"] == 0
    assert lm.parse_generations(captured) == [""]
    assert lm.finish == {task_eval.prompt_key([{"role": "user", "content": "q"}]): "length"}


def test_a_chat_answer_without_choices_is_unreadable() -> None:
    with pytest.raises(Unreadable, match="r1: /v1/chat/completions: the answer has no choices"):
        chat_model().parse_generations({"object": "error"})


def test_a_sample_is_matched_to_its_request_by_the_prompt() -> None:
    from lm_eval.models.api_models import JsonChatStr

    messages = [{"role": "user", "content": "ctx\n\nWhat is the passcode of x?"}]
    # lm-eval 0.4.13 logs the request's args with the JsonChatStr turned into a plain tuple.
    as_logged = {"arguments": [((json.dumps(messages),), {"until": []})]}
    assert task_eval._sample_prompt(as_logged) == task_eval.prompt_key(messages)
    in_memory = {"arguments": [(JsonChatStr(json.dumps(messages)), {"until": []})]}
    assert task_eval._sample_prompt(in_memory) == task_eval.prompt_key(messages)
    assert task_eval._sample_prompt({"arguments": [("not json", {})]}) == ""


def test_a_registry_task_whose_data_is_not_on_disk_is_one_line_not_a_download() -> None:
    # registry = true indexes lm-eval's own tasks; arc_easy's data is on the Hub, never fetched here.
    with pytest.raises(ConfigError) as info:
        task_eval.load_task("arc_easy", TASKS_DIR, True, None, 5)
    (line,) = info.value.problems
    assert line.startswith("tasks: 'arc_easy': lm-eval cannot load it: ") and "Offline" in line
    with pytest.raises(ConfigError, match="set \\[tasks\\] registry = true"):
        task_eval.load_task("arc_easy", TASKS_DIR, False, None, 5)
