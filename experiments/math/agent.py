"""The ``math`` agent, written with LangChain: a multi-turn loop with a calculator tool.

The model sees the problem and may call ``calculator(expression)`` through OpenAI tool calls;
the agent runs each call (safely, see :mod:`experiments.math.calculator`) and sends the result
back as a ``tool`` message, until the model answers in plain text or ``max_turns`` LLM calls
are spent. A malformed call (bad JSON, missing ``expression``, unknown tool) gets an error
result message, never an exception. This module does not score the answer (see
:mod:`experiments.math.reward`).

Test seam: ``llm.extra["http_client"]`` (an ``httpx.Client``) is handed to ``ChatOpenAI``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from experiments.math.calculator import CALCULATOR_TOOL, run_calculator
from swarm.client.task import AgentLLM

__all__ = ["SYSTEM_PROMPT", "AgentTrace", "solve"]

SYSTEM_PROMPT = ("Solve the word problem. You may call the calculator tool. "
                 "End with 'Answer: <number>'.")


@dataclass
class AgentTrace:
    """What the agent did: the final text and how its tool calls went."""

    final_text: str = ""
    turns: int = 0
    tool_calls: int = 0
    tool_ok: int = 0
    tool_errors: int = 0
    messages: list[Any] = field(default_factory=list)


def _chat_model(llm: AgentLLM, tool_choice: str | None = None) -> Any:
    from langchain_openai import ChatOpenAI

    kwargs: dict[str, Any] = {}
    if llm.extra.get("http_client") is not None:
        kwargs["http_client"] = llm.extra["http_client"]
    chat = ChatOpenAI(base_url=llm.base_url, api_key=llm.api_key, model=llm.model, temperature=llm.temperature,
                      max_tokens=llm.max_tokens, max_retries=0, **kwargs)
    return chat.bind_tools([CALCULATOR_TOOL], tool_choice=tool_choice)


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content blocks
        return "".join(b.get("text", "") if isinstance(b, dict) else str(b) for b in content)
    return ""


def solve(question: str, llm: AgentLLM, max_turns: int = 4, first_tool_call: bool = False) -> AgentTrace:
    """Run the tool loop on one question; returns the trace (final text, tool-call counts).

    ``first_tool_call``: the first call must call the calculator (``tool_choice`` naming it, as a user
    whose agent always computes first would set it); the model still writes the expression and the answer."""
    from langchain_core.messages import HumanMessage, SystemMessage, ToolMessage

    model = _chat_model(llm)
    forced = _chat_model(llm, tool_choice="calculator") if first_tool_call else model
    trace = AgentTrace(messages=[SystemMessage(SYSTEM_PROMPT), HumanMessage(question)])
    for turn in range(max_turns):
        reply = (forced if turn == 0 else model).invoke(trace.messages)
        trace.turns += 1
        trace.messages.append(reply)
        trace.final_text = _text(reply.content)
        if not reply.tool_calls and not reply.invalid_tool_calls:
            break
        for call in reply.tool_calls:
            trace.tool_calls += 1
            if call.get("name") == "calculator":
                result, ok = run_calculator(call.get("args"))
            else:
                result, ok = f"error: unknown tool {call.get('name')!r}; use calculator", False
            trace.tool_ok += ok
            trace.tool_errors += not ok
            trace.messages.append(ToolMessage(result, tool_call_id=call.get("id") or ""))
        for call in reply.invalid_tool_calls:
            trace.tool_calls += 1
            trace.tool_errors += 1
            trace.messages.append(ToolMessage("error: arguments are not valid JSON",
                                              tool_call_id=call.get("id") or ""))
    return trace
