"""Real clients (openai sync/async/stream/tools, langchain-openai, raw httpx) on the hf tiny model:
3-turn episodes land as 3 exact, prefix-consistent steps whose logprobs match a forward pass."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import openai
import pytest
import torch

from swarm.merge import TrainSeq
from swarm.pool import StepFilter
from swarm.records import Step
from swarm.train.constraint import ConstraintReplay

TOOLS = [{"type": "function", "function": {"name": "lookup", "description": "look a word up",
                                            "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}}]
SAMPLING = {"max_tokens": 12, "temperature": 1.0, "top_p": 1.0}


def episode_steps(gw: Any, episode_id: str) -> list[Step]:
    return gw.pool.query_steps(StepFilter(episode_id=episode_id), with_tokens=True, order="episode")


def check_episode(gw: Any, episode_id: str, turns: int = 3) -> list[Step]:
    """n steps, equal-length ids/logprobs, each turn's full sequence a prefix of the next prompt."""
    steps = episode_steps(gw, episode_id)
    assert [s.index for s in steps] == list(range(turns))
    for s in steps:
        assert s.response_ids and s.response_logprobs is not None
        assert len(s.response_ids) == len(s.response_logprobs)
        assert s.response_id and s.source.value == "blackbox"
    for a, b in zip(steps, steps[1:], strict=False):
        assert b.prefix_consistent is True, b.metadata
        assert b.parent_step_id == a.step_id
        full = a.prompt_ids + a.response_ids
        assert b.prompt_ids[: len(full)] == full
    return steps


def check_logprobs(backend: Any, steps: list[Step]) -> None:
    """Recompute each response token's logprob with one forward pass of the same fp32 weights."""
    model = backend.model
    for s in steps:
        ids = torch.tensor([s.prompt_ids + s.response_ids])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0].float()
        n = len(s.prompt_ids)
        if s.metadata.get("constraint"):  # sampled under a grammar: the masked distribution (swarm.train.constraint)
            masks = ConstraintReplay(backend.tokenizer).masks(TrainSeq.from_step(s, 0.0))
            logits[n - 1 : n - 1 + len(s.response_ids)] = logits[n - 1 : n - 1 + len(s.response_ids)].masked_fill(
                ~masks, float("-inf"))
        lp = torch.log_softmax(logits, dim=-1)
        want = lp[n - 1 : n - 1 + len(s.response_ids)].gather(1, torch.tensor(s.response_ids)[:, None])[:, 0]
        diff = (want - torch.tensor(s.response_logprobs)).abs().max().item()
        assert diff < 1e-4, f"step {s.step_id}: max |logprob diff| = {diff}"


def test_openai_sync_three_turns_with_tools(hf_gateway: Any) -> None:
    ep = hf_gateway.episode()
    client = openai.OpenAI(base_url=ep["base_url"], api_key=ep["api_key"], max_retries=0)
    msgs: list[Any] = [{"role": "system", "content": "you are terse", "name": "sys"},
                       {"role": "user", "content": "hello there"}]
    for k in range(3):
        r = client.chat.completions.create(model="default", messages=msgs, tools=TOOLS, tool_choice="auto",
                                           logprobs=True, top_logprobs=2, seed=k, **SAMPLING)
        choice = r.choices[0]
        assert r.model_extra["swarm"]["step_id"]
        assert len(choice.logprobs.content) == r.usage.completion_tokens
        msgs += [choice.message, {"role": "user", "content": [{"type": "text", "text": f"turn {k}"}]}]
    steps = check_episode(hf_gateway, ep["episode_id"])
    assert steps[0].metadata["tools"][0]["function"]["name"] == "lookup"
    check_logprobs(hf_gateway.backend, steps)


def test_openai_async_streaming_three_turns(hf_gateway: Any) -> None:
    ep = hf_gateway.episode()

    async def run() -> list[str]:
        client = openai.AsyncOpenAI(base_url=ep["base_url"], api_key=ep["api_key"], max_retries=0)
        msgs: list[dict[str, Any]] = [{"role": "user", "content": "count with me"}]
        seen = []
        for k in range(3):
            stream = await client.chat.completions.create(
                model="default", messages=msgs, stream=True, stream_options={"include_usage": True},
                max_completion_tokens=12, temperature=1.0, tools=TOOLS)
            text, chunks, usage, swarm = "", 0, None, None
            async for chunk in stream:
                chunks += 1
                if chunk.usage is not None:
                    assert chunk.choices == []
                    usage = chunk.usage
                for c in chunk.choices:
                    text += c.delta.content or ""
                    swarm = (chunk.model_extra or {}).get("swarm") or swarm
            assert chunks >= 3 and usage is not None and swarm is not None
            seen.append(swarm["step_id"])
            msgs += [{"role": "assistant", "content": text}, {"role": "user", "content": f"and {k}"}]
        await client.close()
        return seen

    ids = asyncio.run(run())
    steps = check_episode(hf_gateway, ep["episode_id"])
    assert [s.step_id for s in steps] == ids
    check_logprobs(hf_gateway.backend, steps)


def test_openai_sync_streaming_is_incremental(hf_gateway: Any) -> None:
    ep = hf_gateway.episode()
    client = openai.OpenAI(base_url=ep["base_url"], api_key=ep["api_key"], max_retries=0)
    stream = client.chat.completions.create(model="default", messages=[{"role": "user", "content": "hi"}],
                                            stream=True, logprobs=True, max_tokens=10, temperature=1.0)
    deltas = [c for c in stream if c.choices and c.choices[0].logprobs and c.choices[0].logprobs.content]
    step = episode_steps(hf_gateway, ep["episode_id"])[0]
    # one chunk per sampled token, each with that token's logprob
    assert len(deltas) == len(step.response_ids)
    assert [d.choices[0].logprobs.content[0].logprob for d in deltas] == pytest.approx(step.response_logprobs)


def test_langchain_three_turns(hf_gateway: Any) -> None:
    from langchain_core.messages import HumanMessage, SystemMessage
    from langchain_openai import ChatOpenAI

    ep = hf_gateway.episode()
    llm = ChatOpenAI(base_url=ep["base_url"], api_key=ep["api_key"], model="default", max_tokens=12,
                     temperature=1.0, max_retries=0)
    msgs: list[Any] = [SystemMessage("answer"), HumanMessage("what is up")]
    for k in range(3):
        reply = llm.invoke(msgs)
        msgs += [reply, HumanMessage(f"more {k}")]
    check_logprobs(hf_gateway.backend, check_episode(hf_gateway, ep["episode_id"]))


def test_langchain_streaming_with_tools(hf_gateway: Any) -> None:
    from langchain_core.messages import HumanMessage
    from langchain_openai import ChatOpenAI

    ep = hf_gateway.episode()
    llm = ChatOpenAI(base_url=ep["base_url"], api_key=ep["api_key"], model="default", max_tokens=12,
                     temperature=1.0, max_retries=0, streaming=True).bind_tools(TOOLS)
    msgs: list[Any] = [HumanMessage("look up 'fox'")]
    for k in range(3):
        reply = None
        for chunk in llm.stream(msgs):
            reply = chunk if reply is None else reply + chunk
        msgs += [reply, HumanMessage(f"again {k}")]
    check_episode(hf_gateway, ep["episode_id"])


def test_httpx_raw_three_turns_and_n2(hf_gateway: Any) -> None:
    ep = hf_gateway.episode()
    url = ep["base_url"] + "/chat/completions"
    headers = {"Authorization": f"Bearer {ep['api_key']}", "x-stainless-lang": "python"}
    msgs: list[dict[str, Any]] = [{"role": "user", "content": "a"}, {"role": "user", "content": "b", "name": "u2"}]
    with httpx.Client(timeout=60) as http:
        for k in range(3):
            body = {"model": "default", "messages": msgs, "stream": False, "logprobs": True, "some_extra": {"x": 1},
                    "response_format": {"type": "json_schema", "json_schema": {"name": "x", "strict": True,
                                                                                "schema": {"type": "object"}}},
                    "parallel_tool_calls": False, "user": "me", **SAMPLING}
            r = http.post(url, json=body, headers=headers)
            assert r.status_code == 200, r.text
            msg = r.json()["choices"][0]["message"]
            msgs += [{"role": "assistant", "content": msg["content"]}, {"role": "user", "content": f"t{k}"}]
        steps = check_episode(hf_gateway, ep["episode_id"])
        check_logprobs(hf_gateway.backend, steps)
        # n=2: one step per choice, same group, both continuing from the same prompt
        r = http.post(url, json={"model": "default", "messages": msgs, "n": 2, **SAMPLING}, headers=headers)
        assert r.status_code == 200, r.text
        data = r.json()
    assert len(data["choices"]) == 2 and len(data["swarm"]["step_ids"]) == 2
    s0, s1 = (hf_gateway.pool.get_step(i) for i in data["swarm"]["step_ids"])
    assert s0.group_id == s1.group_id is not None and s0.prompt_ids == s1.prompt_ids
    assert {s0.index, s1.index} == {3, 4} and s0.prefix_consistent is True


def test_completions_route(hf_gateway: Any) -> None:
    ep = hf_gateway.episode()
    client = openai.OpenAI(base_url=ep["base_url"], api_key=ep["api_key"], max_retries=0)
    r = client.completions.create(model="default", prompt="once upon a time", max_tokens=8, logprobs=1,
                                  temperature=1.0)
    assert r.choices[0].logprobs.token_logprobs
    text = "".join(c.choices[0].text for c in client.completions.create(
        model="default", prompt=[5, 6, 7], max_tokens=8, stream=True) if c.choices)
    steps = episode_steps(hf_gateway, ep["episode_id"])
    # the pool stores text with NUL as U+FFFD (PostgreSQL refuses NUL; the token ids keep it exactly), and the
    # unseeded tiny model sometimes samples the byte-0 token
    assert len(steps) == 2 and steps[1].prompt_ids == [5, 6, 7] and steps[1].response_text == text.replace("\x00", "\ufffd")
    check_logprobs(hf_gateway.backend, steps[:1])
    assert json.loads(json.dumps(r.model_extra["swarm"]))["step_id"] == steps[0].step_id
