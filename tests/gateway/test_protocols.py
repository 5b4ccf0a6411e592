"""/v1/responses and /v1/messages through the official openai and anthropic SDKs and the OpenAI Agents SDK:
tool calls across turns, streamed and not, recorded as exact prefix-consistent steps; errors in each shape."""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any

import openai
import pytest
import torch

from swarm.policy.echo import EchoBackend
from swarm.pool import StepFilter
from swarm.records import Step

anthropic = pytest.importorskip("anthropic", reason="the anthropic SDK is not installed (pip install -e '.[agents]')")

RTOOLS = [{"type": "function", "name": "search", "description": "search the web",
           "parameters": {"type": "object", "properties": {"input": {"type": "string"}}}}]
ATOOLS = [{"name": "search", "description": "search the web",
           "input_schema": {"type": "object", "properties": {"input": {"type": "string"}}}}]
VOTE = {"type": "object", "properties": {"target": {"type": "string", "enum": ["alice", "bob", "carol"]}},
        "required": ["target"], "additionalProperties": False}


def steps_of(gw: Any, episode_id: str, n: int, protocol: str) -> list[Step]:
    """The episode's ``n`` steps, each turn's prompt + response an exact prefix of the next prompt."""
    steps = gw.pool.query_steps(StepFilter(episode_id=episode_id), with_tokens=True, order="episode")
    assert [s.index for s in steps] == list(range(n))
    for s in steps:
        assert s.metadata["protocol"] == protocol and s.response_ids
        assert s.response_logprobs is not None and len(s.response_logprobs) == len(s.response_ids)
    assert steps[0].prefix_consistent is None
    for a, b in zip(steps, steps[1:], strict=False):
        assert b.prefix_consistent is True, b.metadata
        assert b.parent_step_id == a.step_id
        assert b.prompt_ids[: len(a.prompt_ids) + len(a.response_ids)] == a.prompt_ids + a.response_ids
    return steps


def forward_logprobs_match(backend: Any, steps: list[Step]) -> float:
    """Largest |recorded - recomputed| response-token logprob over ``steps`` (one fp32 forward pass each)."""
    worst = 0.0
    for s in steps:
        with torch.no_grad():
            logits = backend.model(input_ids=torch.tensor([s.prompt_ids + s.response_ids])).logits[0].float()
        n = len(s.prompt_ids)
        lp = torch.log_softmax(logits[n - 1 : n - 1 + len(s.response_ids)], dim=-1)
        want = lp.gather(1, torch.tensor(s.response_ids)[:, None])[:, 0]
        worst = max(worst, (want - torch.tensor(s.response_logprobs)).abs().max().item())
    return worst


def test_responses_tool_loop_streamed_and_not(gateway: Any) -> None:
    ep = gateway.episode()
    client = openai.OpenAI(base_url=ep["base_url"], api_key=ep["api_key"], max_retries=0)
    kw: dict[str, Any] = {"model": "default", "instructions": "be terse", "tools": RTOOLS}
    items: list[Any] = [{"role": "user", "content": "find foxes"}]
    r = client.responses.create(input=items, **kw)
    call = r.output[0]
    assert r.status == "completed" and call.type == "function_call" and call.name == "search"
    assert json.loads(call.arguments) == {"input": "find foxes"}
    items += [o.model_dump(exclude_none=True) for o in r.output]
    items.append({"type": "function_call_output", "call_id": call.call_id, "output": "3 foxes"})
    events = list(client.responses.create(input=items, stream=True, **kw))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == "3 foxes"
    done = events[-1].response
    assert done.output_text == "3 foxes" and done.usage.output_tokens > 0
    items += [o.model_dump(exclude_none=True) for o in done.output] + [{"role": "user", "content": "more"}]
    streamed = list(client.responses.create(input=items, stream=True, **kw))
    last = streamed[-1].response.output[0]
    assert last.type == "function_call" and json.loads(last.arguments) == {"input": "more"}
    assert "response.function_call_arguments.done" in [e.type for e in streamed]
    steps = steps_of(gateway, ep["episode_id"], 3, "responses")
    assert [s.response_id for s in steps[:2]] == [r.id, done.id]
    assert steps[0].tool_calls[0]["id"] == call.call_id and r.model_extra["swarm"]["step_id"] == steps[0].step_id
    assert steps[0].prompt_messages[0] == {"role": "system", "content": "be terse"}


def test_messages_tool_loop_streamed_and_not(gateway: Any) -> None:
    ep = gateway.episode()
    client = anthropic.Anthropic(base_url=gateway.url, api_key=ep["api_key"], max_retries=0)
    kw: dict[str, Any] = {"model": "default", "max_tokens": 200, "system": "be terse", "tools": ATOOLS}
    msgs: list[Any] = [{"role": "user", "content": "find foxes"}]
    r = client.messages.create(messages=msgs, **kw)
    use = r.content[0]
    assert r.stop_reason == "tool_use" and use.type == "tool_use" and use.input == {"input": "find foxes"}
    msgs += [{"role": "assistant", "content": r.content},
             {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "3 foxes"}]}]
    with client.messages.stream(messages=msgs, **kw) as stream:
        text = "".join(stream.text_stream)
        m = stream.get_final_message()
    assert text == "3 foxes" == m.content[0].text and m.stop_reason == "end_turn" and m.usage.output_tokens > 0
    msgs += [{"role": "assistant", "content": m.content}, {"role": "user", "content": [{"type": "text", "text": "more"}]}]
    with client.messages.stream(messages=msgs, **kw) as stream:
        m3 = stream.get_final_message()
    assert m3.stop_reason == "tool_use" and m3.content[0].input == {"input": "more"}
    steps = steps_of(gateway, ep["episode_id"], 3, "messages")
    assert [s.response_id for s in steps] == [r.id, m.id, m3.id]
    assert steps[1].prompt_messages[-1] == {"role": "tool", "tool_call_id": use.id, "content": "3 foxes"}
    assert r.model_extra["swarm"]["step_id"] == steps[0].step_id
    count = client.messages.count_tokens(model="default", system="be terse", tools=ATOOLS, messages=msgs[:1])
    assert count.input_tokens == len(steps[0].prompt_ids)
    # max_tokens is a ceiling here (Anthropic clients send 8192, 32000): more than the context holds still answers
    with client.messages.stream(model="default", max_tokens=100_000, messages=[{"role": "user", "content": "hi"}]) as s:
        assert s.get_final_message().content[0].text == "hi"


def test_previous_response_id_continues_from_the_pool(gateway: Any) -> None:
    """A client that sends only the new items (previous_response_id) extends the previous call exactly too."""
    ep = gateway.episode()
    client = openai.OpenAI(base_url=ep["base_url"], api_key=ep["api_key"], max_retries=0)
    kw: dict[str, Any] = {"model": "default", "instructions": "be terse", "tools": RTOOLS}
    r = client.responses.create(input="find foxes", **kw)
    out = {"type": "function_call_output", "call_id": r.output[0].call_id, "output": "3 foxes"}
    r2 = client.responses.create(input=[out], previous_response_id=r.id, **kw)
    assert r2.output_text == "3 foxes" and r2.previous_response_id == r.id
    r3 = client.responses.create(input="more", previous_response_id=r2.id, stream=True, **kw)
    assert list(r3)[-1].response.output[0].type == "function_call"
    steps_of(gateway, ep["episode_id"], 3, "responses")
    other = gateway.episode()
    r = gateway.post("/v1/responses", other["api_key"], json={"model": "default", "input": "x",
                                                              "previous_response_id": r2.id})
    assert r.status_code == 404 and r.json()["error"]["param"] == "previous_response_id"


def test_one_episode_may_switch_protocols(gateway: Any) -> None:
    ep = gateway.episode()
    msgs = [{"role": "user", "content": "hello"}]
    chat = gateway.chat(ep["api_key"], msgs).json()["choices"][0]["message"]["content"]
    msgs += [{"role": "assistant", "content": chat}, {"role": "user", "content": "and you"}]
    resp = openai.OpenAI(base_url=ep["base_url"], api_key=ep["api_key"], max_retries=0).responses.create(
        model="default", input=msgs)
    msgs += [{"role": "assistant", "content": resp.output_text}, {"role": "user", "content": "bye"}]
    anthropic.Anthropic(base_url=gateway.url, api_key=ep["api_key"], max_retries=0).messages.create(
        model="default", max_tokens=64, messages=msgs)
    steps = gateway.pool.query_steps(StepFilter(episode_id=ep["episode_id"]), with_tokens=True, order="episode")
    assert [s.metadata.get("protocol") for s in steps] == [None, "responses", "messages"]
    assert [s.prefix_consistent for s in steps] == [None, True, True]


def test_tiny_model_steps_are_exact_in_both_protocols(hf_gateway: Any) -> None:
    """On a real model: the logprobs sent and stored are those a forward pass gives, streamed or not."""
    ep = hf_gateway.episode()
    oa = openai.OpenAI(base_url=ep["base_url"], api_key=ep["api_key"], max_retries=0)
    items: list[Any] = [{"role": "user", "content": "hello there"}]
    r = oa.responses.create(model="default", input=items, max_output_tokens=12,
                            include=["message.output_text.logprobs"])
    sent = [lp.logprob for lp in r.output[0].content[0].logprobs]
    assert len(sent) == r.usage.output_tokens
    items += [o.model_dump(exclude_none=True) for o in r.output] + [{"role": "user", "content": "and then?"}]
    list(oa.responses.create(model="default", input=items, max_output_tokens=12, stream=True))
    steps = steps_of(hf_gateway, ep["episode_id"], 2, "responses")
    assert steps[0].response_logprobs == pytest.approx(sent, abs=1e-6)
    ep2 = hf_gateway.episode()
    an = anthropic.Anthropic(base_url=hf_gateway.url, api_key=ep2["api_key"], max_retries=0)
    msgs: list[Any] = [{"role": "user", "content": "hello there"}]
    with an.messages.stream(model="default", max_tokens=12, messages=msgs) as stream:
        m = stream.get_final_message()
    msgs += [{"role": "assistant", "content": m.content}, {"role": "user", "content": "and then?"}]
    an.messages.create(model="default", max_tokens=12, messages=msgs)
    steps += steps_of(hf_gateway, ep2["episode_id"], 2, "messages")
    assert forward_logprobs_match(hf_gateway.backend, steps) < 1e-4


def test_structured_output_in_both_protocols(hf_gateway: Any) -> None:
    ep = hf_gateway.episode()
    oa = openai.OpenAI(base_url=ep["base_url"], api_key=ep["api_key"], max_retries=0)
    fmt = {"format": {"type": "json_schema", "name": "vote", "schema": VOTE, "strict": True}}
    r = oa.responses.create(model="default", input="Vote.", text=fmt, max_output_tokens=48)
    assert json.loads(r.output_text)["target"] in VOTE["properties"]["target"]["enum"]
    an = anthropic.Anthropic(base_url=hf_gateway.url, api_key=hf_gateway.episode()["api_key"], max_retries=0)
    m = an.messages.create(model="default", max_tokens=48, messages=[{"role": "user", "content": "Vote."}],
                           output_config={"format": {"type": "json_schema", "schema": VOTE}})
    assert json.loads(m.content[0].text)["target"] in VOTE["properties"]["target"]["enum"]
    rec = hf_gateway.pool.query_steps(StepFilter(episode_id=ep["episode_id"]))[0].metadata["constraint"]
    assert rec["kind"] == "json_schema" and json.loads(rec["schema"]) == VOTE
    # a forced tool call, streamed: the tiny model calls it under the grammar in both protocols
    vote = [{"type": "function", "name": "vote", "parameters": VOTE}]
    events = list(oa.responses.create(model="default", input="Vote.", tools=vote, stream=True, max_output_tokens=64,
                                      tool_choice={"type": "function", "name": "vote"}))
    call = events[-1].response.output[0]
    assert call.type == "function_call" and json.loads(call.arguments)["target"] in VOTE["properties"]["target"]["enum"]
    with an.messages.stream(model="default", max_tokens=64, messages=[{"role": "user", "content": "Vote."}],
                            tools=[{"name": "vote", "input_schema": VOTE}],
                            tool_choice={"type": "tool", "name": "vote"}) as stream:
        use = stream.get_final_message().content[0]
    assert use.type == "tool_use" and use.input["target"] in VOTE["properties"]["target"]["enum"]


def test_errors_come_in_each_protocols_shape_and_store_nothing(gateway: Any) -> None:
    ep = gateway.episode()
    body = {"model": "default", "input": "hi"}
    r = gateway.post("/v1/responses", None, json=body)
    assert r.status_code == 401 and set(r.json()["error"]) == {"message", "type", "param", "code"}
    for extra, param in [({"conversation": "conv_1"}, "conversation"),
                         ({"max_output_tokens": 10**6}, "max_output_tokens"),
                         ({"text": {"format": {"type": "json_schema", "name": "v", "schema": VOTE}}}, "text.format"),
                         ({"tools": [{"type": "web_search"}]}, "tools.0.type"),
                         ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
                          "input.0.content.0")]:
        r = gateway.post("/v1/responses", ep["api_key"], json={**body, **extra})
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    client = anthropic.Anthropic(base_url=gateway.url, api_key=ep["api_key"], max_retries=0)
    msgs = [{"role": "user", "content": "hi"}]
    with pytest.raises(anthropic.NotFoundError) as nf:
        client.messages.create(model="nope", max_tokens=8, messages=msgs)
    assert nf.value.body["type"] == "error" and nf.value.body["error"]["type"] == "not_found_error"
    with pytest.raises(anthropic.AuthenticationError):
        anthropic.Anthropic(base_url=gateway.url, api_key="sk-swarm-forged", max_retries=0).messages.create(
            model="default", max_tokens=8, messages=msgs)
    for bad in [{"messages": msgs}, {"max_tokens": 8, "messages": [{"role": "user", "content": [
            {"type": "image", "source": {"type": "url", "url": "x"}}]}]},
            {"max_tokens": 8, "messages": [*msgs, {"role": "assistant", "content": "The answer is"}]}]:
        r = gateway.post("/v1/messages", ep["api_key"], json={"model": "default", **bad})
        assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error", r.text
        assert r.json()["type"] == "error"
    assert gateway.pool.query_steps(StepFilter(episode_id=ep["episode_id"])) == []
    gateway.post(f"/v1/episodes/{ep['episode_id']}/end", ep["api_key"], json={})
    with pytest.raises(anthropic.PermissionDeniedError):
        client.messages.create(model="default", max_tokens=8, messages=msgs)


def test_a_failure_after_the_first_event_is_an_error_event_in_each_protocol(make_gateway: Any) -> None:
    """The episode ends while its reply streams: the step cannot be stored, and each SDK raises on the error event."""
    gw = make_gateway(EchoBackend(delay_s=0.6))
    ep = gw.episode()
    stream = openai.OpenAI(base_url=ep["base_url"], api_key=ep["api_key"], max_retries=0).responses.create(
        model="default", input="a reply that takes a while", stream=True)
    with pytest.raises(openai.APIError, match="not open"):
        for event in stream:
            if event.type == "response.output_text.delta":
                gw.post(f"/v1/episodes/{ep['episode_id']}/end", ep["api_key"], json={})
    ep = gw.episode()
    client = anthropic.Anthropic(base_url=gw.url, api_key=ep["api_key"], max_retries=0)
    with pytest.raises(anthropic.APIError, match="not open"):
        with client.messages.stream(model="default", max_tokens=64, messages=[{"role": "user", "content": "a while"}]) \
                as events:
            for event in events:
                if event.type == "content_block_delta":
                    gw.post(f"/v1/episodes/{ep['episode_id']}/end", ep["api_key"], json={})
    assert gw.pool.query_steps(StepFilter(task="t")) == []


def test_idempotency_key_replays_a_response(gateway: Any) -> None:
    ep = gateway.episode()
    client = openai.OpenAI(base_url=ep["base_url"], api_key=ep["api_key"], max_retries=0)
    once = client.responses.create(model="default", input="hi", extra_headers={"Idempotency-Key": "k1"})
    again = list(client.responses.create(model="default", input="hi", stream=True,
                                         extra_headers={"Idempotency-Key": "k1"}))[-1].response
    assert again.id == once.id and again.output_text == once.output_text == "hi"
    assert again.model_extra["swarm"]["replayed"] is True
    assert len(gateway.pool.query_steps(StepFilter(episode_id=ep["episode_id"]))) == 1


def test_openai_agents_sdk_on_its_default_responses_model(gateway: Any) -> None:
    os.environ.setdefault("OPENAI_AGENTS_DISABLE_TRACING", "1")  # its tracer would export to api.openai.com
    agents = pytest.importorskip("agents", reason="openai-agents is not installed (pip install -e '.[agents]')")
    agents.set_tracing_disabled(True)

    @agents.function_tool
    def search(input: str) -> str:  # noqa: A002 - the echo backend calls the first tool with {"input": ...}
        """Search the web."""
        return f"3 results for {input}"

    ep = gateway.episode()

    async def run() -> Any:
        client = openai.AsyncOpenAI(base_url=ep["base_url"], api_key=ep["api_key"], max_retries=0)
        agent = agents.Agent(name="a", instructions="be terse", tools=[search],
                             model=agents.OpenAIResponsesModel(model="default", openai_client=client))
        return await agents.Runner.run(agent, "find foxes")

    result = asyncio.run(run())
    assert result.final_output == "3 results for find foxes"
    steps = steps_of(gateway, ep["episode_id"], 2, "responses")
    assert steps[0].tool_calls[0]["function"]["name"] == "search"
