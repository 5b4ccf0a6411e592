"""run_multiagent for werewolves with a fake gateway (mocked HTTP): episodes, policies, history, rewards."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest

from experiments.werewolves import Options, make_instance, run_multiagent
from swarm.client.worker import WorkerConfig


def legal_reply(body: dict[str, Any]) -> str:
    """A well-behaved policy: the first legal choice of the request's JSON schema; speech: a short line."""
    fmt = body.get("response_format")
    if fmt is None:
        return "I am a simple villager."
    props = fmt["json_schema"]["schema"]["properties"]
    return json.dumps({k: v["enum"][0] for k, v in props.items()})


class FakeGateway:
    """Episodes in memory; chat completions answered by ``policies[model](last user text)``."""

    def __init__(self, fail_after: int | None = None) -> None:
        self.episodes: list[FakeEpisode] = []
        self.requests: dict[str, list[dict[str, Any]]] = {}
        self.replies: dict[str, list[str]] = {}
        self.fail_after = fail_after
        self.policies = {"bad": lambda _b: "I think player 3 is bad."}

    def handler(self, request: httpx.Request) -> httpx.Response:
        key = request.headers["authorization"].split()[-1]
        body = json.loads(request.content)
        self.requests.setdefault(key, []).append(body)
        if self.fail_after is not None and sum(map(len, self.requests.values())) > self.fail_after:
            return httpx.Response(500, json={"error": {"type": "server_error", "message": "boom"}})
        text = self.policies.get(body["model"], legal_reply)(body)
        self.replies.setdefault(key, []).append(text)
        return httpx.Response(200, json={
            "id": "c", "object": "chat.completion", "created": 0, "model": body["model"],
            "swarm": {"step_id": f"{key}-{len(self.requests[key])}"},
            "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": text}}]})

    def begin(self, **kw: Any) -> FakeEpisode:
        ep = FakeEpisode(self, f"key-{len(self.episodes)}", kw)
        self.episodes.append(ep)
        return ep


class FakeEpisode:
    def __init__(self, gw: FakeGateway, key: str, kw: dict[str, Any]) -> None:
        self.gw, self.api_key, self.kw = gw, key, kw
        self.ended, self.aborted, self.reward, self.metrics = False, False, None, {}
        self.step_rewards: dict[str, float] | None = None

    def openai(self, **kwargs: Any) -> openai.OpenAI:
        return openai.OpenAI(base_url="http://gw.test/v1", api_key=self.api_key,
                             http_client=httpx.Client(transport=httpx.MockTransport(self.gw.handler)), **kwargs)

    def heartbeat(self) -> None:
        pass

    def end(self, reward: float | None = None, step_rewards: dict[str, float] | None = None, **metrics: Any) -> None:
        self.ended, self.reward, self.metrics, self.step_rewards = True, reward, metrics, step_rewards

    def abort(self) -> None:
        self.ended = self.aborted = True


def cfg(**options: Any) -> WorkerConfig:
    """A worker's config whose task options are this process's (as the worker makes them at start)."""
    Options.from_options(options).use()
    return WorkerConfig(server="http://gw.test", task="werewolves", max_tokens=48, options=options)


@pytest.mark.parametrize("pays", ["eliminated", "named"])
def test_default_village_seats_vote_through_constrained_compact_calls(pays: str) -> None:
    gw, inst = FakeGateway(), make_instance(3)
    parts = run_multiagent(inst, gw, "werewolves-3", cfg(llm_decisions=["vote"], vote_shaping=0.5, vote_shaping_pays=pays))
    village = [i for i, r in enumerate(inst["roles"]) if r != "werewolf"]
    assert sorted(ep.kw["metadata"]["player"] for ep in gw.episodes) == village
    for ep in gw.episodes:
        assert ep.kw["task"] == "werewolves" and ep.kw["type"] == "train" and ep.kw["group_id"] == "werewolves-3"
        assert ep.kw["metadata"]["seed"] == 3 and ep.ended and not ep.aborted
        assert ep.reward == pytest.approx(parts["win"] + ep.metrics["vote_bonus"])  # legal replies: no penalty
        paid = ep.metrics["vote_kills" if pays == "eliminated" else "vote_hits"]
        assert ep.metrics["vote_bonus"] == pytest.approx(0.5 * paid / ep.metrics["votes"] if ep.metrics["votes"] else 0.0)
        for req in gw.requests.get(ep.api_key, []):  # only votes, each a fresh two-message chat
            assert req["model"] == "default" and req["max_tokens"] == 48 and len(req["messages"]) == 2
            assert req["response_format"]["json_schema"]["name"] == "vote"
            assert req["messages"][1]["content"].startswith(f"you {ep.kw['metadata']['player']} ")
        assert ep.metrics["format_errors"] == 0.0 and ep.metrics["calls"] == len(gw.requests.get(ep.api_key, []))
        if ep.metrics["calls"]:  # each vote step has its own shaped reward; their mean is the episode's
            assert ep.step_rewards is not None and len(ep.step_rewards) == ep.metrics["calls"]
            assert sum(ep.step_rewards.values()) / len(ep.step_rewards) == pytest.approx(ep.reward)
            assert set(ep.step_rewards.values()) <= {parts["win"], parts["win"] + 0.5}
    assert {"reward", "win", "format_penalty", "vote_bonus", "rounds", "format_error_rate", "llm_calls"} <= set(parts)
    assert parts["format_penalty"] == 0.0 and parts["format_error_rate"] == 0.0 and parts["llm_calls"] > 0


def test_transcript_mode_grows_one_conversation_per_seat() -> None:
    gw, inst = FakeGateway(), make_instance(3)
    run_multiagent(inst, gw, "g", cfg(trainable_side="wolves", observation="transcript",
                                      llm_decisions=["wolf_kill", "speak", "vote", "last_words"]))
    for ep in gw.episodes:
        assert ep.kw["metadata"]["role"] == "werewolf"
        reqs, replies = gw.requests[ep.api_key], gw.replies[ep.api_key]
        assert 0 < len(reqs) <= 40
        for prev, nxt, reply in zip(reqs, reqs[1:], replies, strict=False):  # each call extends the previous one
            assert nxt["messages"][:len(prev["messages"]) + 1] == prev["messages"] + [
                {"role": "assistant", "content": reply}]
        assert {r.get("response_format") is None for r in reqs} == {True, False}  # speech free, decisions JSON


def test_per_role_policies_village_side_and_frozen_opponents() -> None:
    gw, inst = FakeGateway(), make_instance(8)
    policies = {"villager": "vil", "seer": "seer", "witch": "witch", "hunter": "hunter"}
    parts = run_multiagent(inst, gw, "g", cfg(trainable_side="village", role_policies=policies,
                                              opponents="policy:frozen"))
    assert len(gw.episodes) == 9 and all(ep.ended for ep in gw.episodes)
    for ep in gw.episodes:
        role = ep.kw["metadata"]["role"]
        model = "frozen" if role == "werewolf" else policies[role]
        assert ep.kw["type"] == ("eval" if role == "werewolf" else "train")
        assert ep.kw["metadata"]["policy"] == model
        assert {r["model"] for r in gw.requests.get(ep.api_key, [])} <= {model}
    assert parts["win"] in (0.0, 1.0)


def test_malformed_replies_fall_back_and_are_penalised() -> None:
    gw = FakeGateway()
    parts = run_multiagent(make_instance(1), gw, "g", cfg(role_policies={"villager": "bad", "seer": "bad",
                                                                          "witch": "bad", "hunter": "bad"},
                                                          llm_decisions=["vote", "seer", "witch", "hunter"]))
    assert parts["format_penalty"] < 0 and parts["format_error_rate"] == 1.0
    assert parts["reward"] == pytest.approx(parts["win"] + parts["format_penalty"] + parts["vote_bonus"])
    for ep in gw.episodes:
        assert ep.metrics["format_errors"] == ep.metrics["calls"]
        assert ep.reward == pytest.approx(ep.metrics["win"] + ep.metrics["format_penalty"] + ep.metrics["vote_bonus"])


def test_an_error_aborts_every_episode_of_the_game() -> None:
    gw = FakeGateway(fail_after=4)
    with pytest.raises(openai.InternalServerError):
        run_multiagent(make_instance(2), gw, "g", cfg())
    assert gw.episodes and all(ep.aborted for ep in gw.episodes)


def test_context_refusal_hands_the_seat_to_the_rules_without_penalty() -> None:
    gw = FakeGateway()

    original = gw.handler

    def handler(request: httpx.Request) -> httpx.Response:
        if len(gw.requests.get(request.headers["authorization"].split()[-1], [])) >= 2:
            return httpx.Response(400, json={"error": {"type": "context_length", "message": "too long"}})
        return original(request)

    gw.handler = handler  # type: ignore[method-assign]
    parts = run_multiagent(make_instance(4), gw, "g", cfg())
    assert parts["format_penalty"] == 0.0
    assert all(ep.metrics["calls"] <= 2.0 and ep.metrics["llm_errors"] in (0.0, 1.0) for ep in gw.episodes)
    assert all(ep.metrics["calls"] == 2.0 for ep in gw.episodes if ep.metrics["llm_errors"])  # refused on call 3
    assert any(ep.metrics["llm_errors"] == 1.0 for ep in gw.episodes)


def test_options_are_validated_with_the_key_and_the_fix() -> None:
    assert Options.from_options({}).trainable_side == "village"
    for bad, word in [({"trainable_side": "wolf"}, "trainable_side"), ({"opponents": "gpt"}, "opponents"),
                      ({"role_policies": {"wolf": "x"}}, "role_policies"), ({"colour": 1}, "colour"),
                      ({"max_rounds": 9}, "max_rounds"), ({"observation": "full"}, "observation"),
                      ({"llm_decisions": ["dance"]}, "llm_decisions"), ({"vote_shaping": 2}, "vote_shaping"),
                      ({"vote_shaping_pays": "agreed"}, "vote_shaping_pays")]:
        with pytest.raises(ValueError, match=rf"task.options.{word}"):
            Options.from_options(bad)
