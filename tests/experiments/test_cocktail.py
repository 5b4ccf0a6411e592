"""The cocktail task: weighted, deterministic sub-task draws and delegation to the sub-task."""

from __future__ import annotations

from collections import Counter

import httpx
import pytest

import experiments.cocktail as cocktail
from experiments.echo import make_instance as echo_instance
from swarm.client.task import AgentLLM, check_options, load_task


def test_default_mix_is_respected_and_deterministic() -> None:
    counts = Counter(cocktail.make_instance(s)["task"] for s in range(2000))
    assert set(counts) == {"echo", "math"} and abs(counts["echo"] / 2000 - 0.5) < 0.05
    assert cocktail.make_instance(17) == cocktail.make_instance(17)


def test_configured_mix_is_respected() -> None:
    assert cocktail.Options(mix={"echo": 1, "math": 3}).use().mix == {"echo": 1.0, "math": 3.0}
    counts = Counter(cocktail.pick_task(s)[0] for s in range(4000))
    assert abs(counts["math"] / 4000 - 0.75) < 0.03
    cocktail.Options(mix={"echo": 1.0, "math": 0}).use()
    assert {cocktail.make_instance(s)["task"] for s in range(200)} == {"echo"}


def test_sub_instance_is_the_sub_task_instance_of_the_sub_seed() -> None:
    inst = next(cocktail.make_instance(s) for s in range(50) if cocktail.make_instance(s)["task"] == "echo")
    assert inst["instance"] == echo_instance(inst["seed"])


@pytest.mark.parametrize("mix,word", [({}, "empty"), ({"echo": -1}, ">= 0"), ({"echo": 0}, "all weights"),
                                      ({"nope": 1}, "nope"), ({"werewolves": 1}, "multi-agent"),
                                      ({"cocktail": 1}, "itself")])
def test_bad_mixes_are_refused(mix: dict[str, float], word: str) -> None:
    with pytest.raises(ValueError, match=rf"task.options.mix.*{word}"):
        check_options(load_task("cocktail"), {"mix": mix})
    assert cocktail.Options.current().mix == cocktail.DEFAULT_MIX  # a refused mix changes nothing


def test_run_episode_delegates_to_the_sub_task() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"id": "c", "object": "chat.completion", "created": 0, "model": "m",
                                         "choices": [{"index": 0, "finish_reason": "stop", "message": {
                                             "role": "assistant", "content": "apple Answer: 12"}}]})

    http = httpx.Client(transport=httpx.MockTransport(handler))
    echo = {"task": "echo", "instance": {"verb": "say", "word": "apple"}, "seed": 0}
    math = {"task": "math", "instance": {"question": "?", "answer": 12, "max_turns": 2}, "seed": 0}
    assert cocktail.run_episode(math, AgentLLM("http://x/v1", "k", extra={"http_client": http}))["correct"] == 1.0
    import openai

    llm = AgentLLM("http://x/v1", "k")
    llm.openai = lambda **kw: openai.OpenAI(base_url="http://x/v1", api_key="k", http_client=http)  # type: ignore[method-assign]
    assert set(cocktail.run_episode(echo, llm)) == {"reward", "exact", "similarity"}
