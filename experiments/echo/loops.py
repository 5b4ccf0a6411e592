"""The echo task's agent loops: one chat turn sent through one of four client stacks.

Each loop sends the same request (the messages, ``model``, and :meth:`AgentLLM.sampling`'s temperature,
max_tokens and seed) and returns the reply text, so a run differs by the client stack alone
(``benchmarks/framework_bench.py`` trains echo through each). Frameworks are imported on first use;
an absent one raises :class:`LoopUnavailable` naming the package to install. This module does not
score replies (:mod:`experiments.echo.reward` does) and does not retry failed calls.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from typing import Any

import httpx

from swarm.client.task import AgentLLM

__all__ = ["LOOPS", "LoopUnavailable", "require", "openai_loop", "langchain_loop", "langgraph_loop", "httpx_loop"]

Messages = list[dict[str, Any]]


class LoopUnavailable(ImportError):
    """A loop's framework cannot be imported; the message names the package to install."""


_NEEDS = {"openai": ("openai",), "langchain": ("langchain_openai",), "langgraph": ("langgraph.graph", "langchain_openai"),
          "httpx": ("httpx",)}
_PIP = {"openai": "openai", "langchain_openai": "langchain-openai", "langgraph.graph": "langgraph", "httpx": "httpx"}


def require(loop: str) -> None:
    """Import ``loop``'s framework now; :class:`LoopUnavailable` (with the pip line) when it is absent."""
    for mod in _NEEDS[loop]:
        try:
            importlib.import_module(mod)
        except ImportError as exc:
            raise LoopUnavailable(f"echo loop {loop!r} needs {_PIP[mod]} (pip install -e '.[agents]'): {exc}") from None


@functools.cache
def _http() -> httpx.Client:
    """One pooled client per process for the httpx and LangChain loops (a client per episode costs an SSL context)."""
    return httpx.Client(timeout=120.0, limits=httpx.Limits(max_connections=256, max_keepalive_connections=64))


def openai_loop(messages: Messages, llm: AgentLLM) -> str:
    """The OpenAI SDK's ``chat.completions.create`` (through :meth:`AgentLLM.chat`)."""
    return llm.chat(messages).content or ""


def _chat_openai(llm: AgentLLM) -> Any:
    from langchain_openai import ChatOpenAI

    p = llm.sampling()
    return ChatOpenAI(model=llm.model, base_url=llm.base_url, api_key=llm.api_key, max_retries=0, http_client=_http(),
                      temperature=p["temperature"], max_tokens=p["max_tokens"], seed=p.get("seed"))


def langchain_loop(messages: Messages, llm: AgentLLM) -> str:
    """LangChain: ``langchain_openai.ChatOpenAI(...).invoke(messages)``."""
    return str(_chat_openai(llm).invoke(messages).content)


def langgraph_loop(messages: Messages, llm: AgentLLM) -> str:
    """LangGraph: a one-node ``StateGraph(MessagesState)`` whose node calls ``ChatOpenAI``."""
    from langgraph.graph import START, MessagesState, StateGraph

    model = _chat_openai(llm)
    builder = StateGraph(MessagesState)
    builder.add_node("model", lambda state: {"messages": [model.invoke(state["messages"])]})
    builder.add_edge(START, "model")
    state = builder.compile().invoke({"messages": messages})
    return str(state["messages"][-1].content)


def httpx_loop(messages: Messages, llm: AgentLLM) -> str:
    """Raw HTTP: POST ``{base_url}/chat/completions`` with httpx and read ``choices[0].message.content``."""
    body = {"model": llm.model, "messages": messages, **llm.sampling()}
    r = _http().post(f"{llm.base_url.rstrip('/')}/chat/completions", json=body,
                     headers={"Authorization": f"Bearer {llm.api_key}"})
    r.raise_for_status()
    return r.json()["choices"][0]["message"]["content"] or ""


LOOPS: dict[str, Callable[[Messages, AgentLLM], str]] = {
    "openai": openai_loop, "langchain": langchain_loop, "langgraph": langgraph_loop, "httpx": httpx_loop}
