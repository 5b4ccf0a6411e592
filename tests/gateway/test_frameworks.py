"""Agent frameworks against a real gateway (echo backend): LangGraph, the OpenAI Agents SDK, AgentScope and the
LiteLLM client, each running two user turns with a tool call, streamed and not, over the protocols they speak
(chat completions, Responses, Anthropic Messages); every call lands as a step, every turn an exact token prefix
of the next. Each framework skips, with the reason, only when it cannot be imported (the ``agents`` extra)."""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any

import pytest

from swarm.pool import StepFilter

# before any framework is imported: no model-price download (LiteLLM), no trace export (Agents SDK)
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("OPENAI_AGENTS_DISABLE_TRACING", "1")

EXTRA = "pip install -e '.[agents]'"
TOOL_SCHEMA = {"type": "object", "properties": {"input": {"type": "string"}}, "required": ["input"]}


def search(input: str) -> str:  # noqa: A002 - the echo backend calls the first tool with {"input": <user text>}
    """Search the web.

    Args:
        input: what to search for
    """
    return f"3 results for {input}"


def check_steps(gw: Any, episode_id: str, protocol: str | None) -> None:
    """Two tool loops: call, answer, call, answer; each step's prompt extends the previous step exactly."""
    steps = gw.pool.query_steps(StepFilter(episode_id=episode_id), with_tokens=True, order="episode")
    assert [bool(s.tool_calls) for s in steps] == [True, False, True, False], [s.response_text for s in steps]
    assert [s.response_text for s in steps[1::2]] == ["3 results for find foxes", "3 results for more"]
    for a, b in zip(steps, steps[1:], strict=False):
        assert b.prefix_consistent is True, b.metadata
        assert b.prompt_ids[: len(a.prompt_ids) + len(a.response_ids)] == a.prompt_ids + a.response_ids
    assert {s.metadata.get("protocol") for s in steps} == {protocol}


@pytest.mark.parametrize("stream", [False, True])
def test_langgraph_tool_agent(gateway: Any, stream: bool) -> None:
    graph = pytest.importorskip("langgraph.graph", reason=f"langgraph is not installed ({EXTRA})")
    prebuilt = pytest.importorskip("langgraph.prebuilt", reason=f"langgraph is not installed ({EXTRA})")
    lc_openai = pytest.importorskip("langchain_openai", reason=f"langchain-openai is not installed ({EXTRA})")
    from langchain_core.tools import tool

    ep = gateway.episode()
    tools = [tool(search)]
    llm = lc_openai.ChatOpenAI(model="default", base_url=ep["base_url"], api_key=ep["api_key"], max_retries=0,
                               streaming=stream, max_tokens=200).bind_tools(tools)
    builder = graph.StateGraph(graph.MessagesState)
    builder.add_node("model", lambda state: {"messages": [llm.invoke(state["messages"])]})
    builder.add_node("tools", prebuilt.ToolNode(tools))
    builder.add_edge(graph.START, "model")
    builder.add_conditional_edges("model", prebuilt.tools_condition)
    builder.add_edge("tools", "model")
    app = builder.compile()
    messages: list[Any] = []
    for text in ("find foxes", "more"):
        inputs = {"messages": [*messages, ("user", text)]}
        if stream:
            tokens, state = [], None
            for mode, data in app.stream(inputs, stream_mode=["messages", "values"]):
                if mode == "values":
                    state = data
                elif data[0].type == "AIMessageChunk":
                    tokens.append(data[0].content)
            assert "".join(tokens).endswith(f"3 results for {text}")
        else:
            state = app.invoke(inputs)
        messages = state["messages"]
        assert messages[-1].content == f"3 results for {text}"
    check_steps(gateway, ep["episode_id"], None)


@pytest.mark.parametrize(("api", "stream"), [("responses", False), ("responses", True), ("chat", True),
                                             ("chained", False)])
def test_openai_agents_sdk(gateway: Any, api: str, stream: bool) -> None:
    agents = pytest.importorskip("agents", reason=f"openai-agents is not installed ({EXTRA})")
    import openai

    agents.set_tracing_disabled(True)
    ep = gateway.episode()

    async def run() -> None:
        client = openai.AsyncOpenAI(base_url=ep["base_url"], api_key=ep["api_key"], max_retries=0)
        model = (agents.OpenAIChatCompletionsModel(model="default", openai_client=client) if api == "chat" else
                 agents.OpenAIResponsesModel(model="default", openai_client=client))
        agent = agents.Agent(name="a", instructions="be terse", tools=[agents.function_tool(search)], model=model)
        history: list[Any] = []
        last_id = None
        for text in ("find foxes", "more"):
            inputs = [*history, {"role": "user", "content": text}]
            if stream:
                result = agents.Runner.run_streamed(agent, inputs)
                kinds = [ev.type async for ev in result.stream_events()]
                assert "raw_response_event" in kinds
            elif api == "chained":  # the server keeps the conversation: only new items are sent
                result = await agents.Runner.run(agent, inputs, previous_response_id=last_id,
                                                 auto_previous_response_id=True)
            else:
                result = await agents.Runner.run(agent, inputs)
            assert result.final_output == f"3 results for {text}"
            history = [] if api == "chained" else result.to_input_list()
            last_id = result.last_response_id

    asyncio.run(run())
    check_steps(gateway, ep["episode_id"], None if api == "chat" else "responses")
    if api == "chained":
        steps = gateway.pool.query_steps(StepFilter(episode_id=ep["episode_id"]), order="episode")
        assert all(s.metadata.get("previous_response_id") == a.response_id for a, s in zip(steps, steps[1:], strict=False))


@pytest.mark.parametrize(("api", "stream"), [("chat", False), ("chat", True), ("messages", True)])
def test_agentscope_agent(gateway: Any, api: str, stream: bool) -> None:
    agent_mod = pytest.importorskip("agentscope.agent", reason=f"agentscope is not installed ({EXTRA})")
    from agentscope.credential import AnthropicCredential, OpenAICredential
    from agentscope.message import Msg, TextBlock
    from agentscope.model import AnthropicChatModel, OpenAIChatModel
    from agentscope.permission import PermissionBehavior, PermissionDecision
    from agentscope.tool import FunctionTool, Toolkit

    ep = gateway.episode()
    if api == "chat":
        model = OpenAIChatModel(credential=OpenAICredential(api_key=ep["api_key"], base_url=ep["base_url"]),
                                model="default", stream=stream, max_retries=0)
    else:
        model = AnthropicChatModel(credential=AnthropicCredential(api_key=ep["api_key"], base_url=gateway.url),
                                   model="default", stream=stream, max_retries=0)
    allow = PermissionDecision(behavior=PermissionBehavior.ALLOW, message="tests run the tool unasked")
    # no injected clock or context-usage notes: they would change the history between turns
    agent = agent_mod.Agent(name="a", system_prompt="be terse", model=model,
                            toolkit=Toolkit(tools=[FunctionTool(search, permission=allow)]),
                            injection_config=agent_mod.InjectionConfig(inject_runtime_state=False))

    async def run() -> None:
        for text in ("find foxes", "more"):
            reply = await agent.reply(Msg(name="user", role="user", content=[TextBlock(text=text)]))
            assert reply.content[-1].text == f"3 results for {text}"

    asyncio.run(run())
    check_steps(gateway, ep["episode_id"], None if api == "chat" else "messages")


@pytest.mark.parametrize(("provider", "stream"), [("openai", False), ("openai", True), ("anthropic", True)])
def test_litellm_client(gateway: Any, provider: str, stream: bool) -> None:
    litellm = pytest.importorskip("litellm", reason=f"litellm is not installed ({EXTRA})")
    litellm.telemetry, litellm.suppress_debug_info = False, True
    ep = gateway.episode()
    base = ep["base_url"] if provider == "openai" else gateway.url
    tools = [{"type": "function", "function": {"name": "search", "description": "Search the web.",
                                               "parameters": TOOL_SCHEMA}}]
    kw = {"model": f"{provider}/default", "api_base": base, "api_key": ep["api_key"], "tools": tools,
          "max_tokens": 200, "num_retries": 0}
    messages: list[Any] = []

    def call() -> Any:
        if not stream:
            return litellm.completion(messages=messages, **kw).choices[0].message
        chunks = list(litellm.completion(messages=messages, stream=True, **kw))
        return litellm.stream_chunk_builder(chunks, messages=messages).choices[0].message

    for text in ("find foxes", "more"):
        messages.append({"role": "user", "content": text})
        msg = call()
        while msg.tool_calls:  # the agent loop: run the tool, send its result back
            messages.append(msg.model_dump(exclude_none=True))
            for c in msg.tool_calls:
                messages.append({"role": "tool", "tool_call_id": c.id,
                                 "content": search(**json.loads(c.function.arguments))})
            msg = call()
        assert msg.content == f"3 results for {text}"
        messages.append({"role": "assistant", "content": msg.content})
    check_steps(gateway, ep["episode_id"], None if provider == "openai" else "messages")
