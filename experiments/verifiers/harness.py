"""A verifiers harness that runs the tool-calling chat loop in this process: no uv, no network, no container.

verifiers' built-in chat harness (``null``) launches a PEP 723 program through ``uv sync --script``, which
installs ``uv`` and the program's packages from the network at the first rollout. This harness runs the
same loop in this process with the libraries already here, built from that program's own parts
(``verifiers.v1.harnesses.utils``): ``core.chat`` for each model call (streamed through the rollout's
interception endpoint, which relays it to the client verifiers was given: our gateway with the episode's
key), ``mcp.connect_mcp``/``mcp.call_mcp`` for the task's tool servers (its ``Toolset`` MCP servers on
127.0.0.1), ``core.gate_tool_call`` for the rollout's tool gate and ``compaction.bound_tool_message`` for
tool results. The loop: call the model with the growing message list; run each tool call and append its
result; stop at a reply without tool calls.

Multi-turn: :meth:`InProcessChatHarness.session` returns a rollout-scoped session that keeps the exact
wire messages it sent and got back, so a user turn from ``agents.<seat>.interaction(task).turn(...)``
appends to that list and every model call extends the previous one (the gateway then reuses the
previous call's token ids: prefix-consistent exact tokens). ``first_tool_choice`` is the ``tool_choice``
of a rollout's first model call when tools are served (later calls use the model's own choice): a
small model that never writes a tool call unaided can be made to call one, through the gateway's
constrained decoding. Deliberately absent: context compaction, and the program's built-in host tools
(bash, edit, web search), which execute on the host or need the network.
"""

from __future__ import annotations

import json
import traceback
from contextlib import AsyncExitStack
from typing import Any, ClassVar

import httpx
import openai
import verifiers.v1 as vf
from pydantic import Field
from verifiers.v1.dialects.chat import message_to_wire
from verifiers.v1.errors import MODEL_TRANSPORT_ERROR_EXIT_CODE
from verifiers.v1.harnesses.utils.compaction import bound_tool_message, is_context_overflow
from verifiers.v1.harnesses.utils.core import chat, gate_tool_call
from verifiers.v1.harnesses.utils.mcp import call_mcp, connect_mcp
from verifiers.v1.runtimes import ProgramResult

from experiments.verifiers.plugins import HARNESS_ID, plugin_id

__all__ = ["InProcessChatHarness", "InProcessChatHarnessConfig", "seat_harness", "tool_choice"]

CHOICES = ("auto", "required", "none")


def tool_choice(value: str) -> str | dict[str, Any] | None:
    """The OpenAI ``tool_choice`` for ``value``: ``required``, ``none``, a tool's name (that tool); ``auto``: unset."""
    if value == "auto":
        return None  # what verifiers' own program sends: the server's default
    if value in CHOICES:
        return value
    return {"type": "function", "function": {"name": value}}


class InProcessChatHarnessConfig(vf.HarnessConfig):
    """``first_tool_choice``: ``auto`` (default), ``required``, ``none`` or a tool name, for a rollout's first call."""

    first_tool_choice: str = Field("auto", min_length=1)


def seat_harness(**knobs: Any) -> InProcessChatHarnessConfig:
    """This harness's config under an id verifiers can load, for an environment's seat declaration
    (``vf.AgentConfig(harness=seat_harness(first_tool_choice="required"))``); the adapter keeps its knobs."""
    return InProcessChatHarnessConfig(id=plugin_id(HARNESS_ID), **knobs)


class InProcessChatSession(vf.HarnessSession):
    """One rollout's chat: its OpenAI client, its MCP connections and the wire messages, kept across turns."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.messages: list[dict[str, Any]] = []
        self.calls = 0
        self._stack = AsyncExitStack()
        self._client: openai.AsyncOpenAI | None = None
        self._tools: list[dict[str, Any]] = []
        self._dispatch: dict[str, tuple[str, str]] = {}
        self._servers: dict[str, Any] = {}
        self._gate: Any = None

    async def _open(self) -> None:
        config = self.harness.config
        self._client = openai.AsyncOpenAI(base_url=self.endpoint, api_key=self.secret, max_retries=0)
        if self.mcp_urls:
            spec = {"mcpServers": {name: {"url": url, "timeout": config.tool_timeout}
                                   for name, url in self.mcp_urls.items()}}
            tools, self._dispatch, self._servers = await connect_mcp(spec, self._stack)
            disabled = set(config.disabled_tools or ())
            self._tools = [t for t in tools if t["function"]["name"] not in disabled]
        if self.tool_interception_url:
            self._gate = await self._stack.enter_async_context(httpx.AsyncClient(timeout=httpx.Timeout(None, connect=5.0)))
        system, prompt = self.harness.resolve_prompt(self.data)
        self.messages = [{"role": "system", "content": system}] if system else []
        if isinstance(prompt, str):
            self.messages.append({"role": "user", "content": prompt})
        elif prompt:
            self.messages += [message_to_wire(m) for m in prompt]

    async def _run(self, messages: vf.Messages | None) -> ProgramResult:
        if self._client is None:
            await self._open()
        self.messages += [message_to_wire(m) for m in messages or []]
        return await self._loop()

    async def _loop(self) -> ProgramResult:
        assert self._client is not None
        while True:
            choice = tool_choice(self.harness.config.first_tool_choice) if self.calls == 0 else None
            self.calls += 1
            try:
                completion = await chat(self._client, self.ctx.model, self.messages, self._tools, tool_choice=choice)
            except SystemExit as exc:  # core.chat exits the program on a dead model connection
                return ProgramResult(exit_code=int(exc.code or MODEL_TRANSPORT_ERROR_EXIT_CODE), stdout="",
                                     stderr=traceback.format_exc())
            except openai.APIStatusError as exc:
                # a refused turn (max_turns, a @stop) or a full context ends the segment, as in verifiers' program
                return ProgramResult(exit_code=0 if is_context_overflow(exc) else 1, stdout="", stderr=str(exc))
            message = completion.choices[0].message
            self.messages.append(message.model_dump(exclude_none=True))
            if not message.tool_calls:
                return ProgramResult(exit_code=0, stdout=message.content or "", stderr="")
            for call in message.tool_calls:
                self.messages.append(await self._tool_result(call))

    async def _tool_result(self, call: Any) -> dict[str, Any]:
        """The tool message for one call: the gate's denial, an error text, or the MCP server's result."""
        name = call.function.name
        if self._gate is not None:
            decision = await gate_tool_call(self._gate, self.tool_interception_url, self.secret, call)
            if decision["action"] == "deny":
                return bound_tool_message(decision["message"])
        try:
            args = json.loads(call.function.arguments or "{}")
        except json.JSONDecodeError as exc:
            content: Any = f"error: invalid JSON in tool arguments ({exc}); resend the call with valid JSON"
        else:
            if not isinstance(args, dict):
                content = f"error: tool arguments must be a JSON object, got {type(args).__name__}"
            elif name not in self._dispatch:
                content = f"error: unknown tool {name!r}"
            else:
                try:
                    content = await call_mcp(self._servers, self._dispatch, name, args)
                except Exception as exc:  # noqa: BLE001 - a tool failure is the model's result, not a crash
                    content = f"error: tool {name!r} failed: {type(exc).__name__}: {exc}"
        return bound_tool_message({"role": "tool", "tool_call_id": call.id, "content": content, "name": name})

    async def close(self) -> None:
        """Close the MCP connections and the client (idempotent)."""
        try:
            await self._stack.aclose()
        finally:
            if self._client is not None:
                client, self._client = self._client, None
                await client.close()
            await super().close()


class InProcessChatHarness(vf.Harness[InProcessChatHarnessConfig]):
    """verifiers' chat-with-tools loop, in-process, through the rollout's interception endpoint."""

    APPENDS_SYSTEM_PROMPT: ClassVar[bool] = True
    SUPPORTS_MCP: ClassVar[bool] = True
    SUPPORTS_RESUME: ClassVar[bool] = True
    SUPPORTS_TOOL_INTERCEPTION: ClassVar[bool] = True
    EXECUTES_CODE: ClassVar[bool] = False
    NEEDS_CONTAINER: ClassVar[bool] = False

    async def session(self, ctx: Any, trace: Any, runtime: Any, endpoint: str, secret: str, mcp_urls: dict[str, str],
                      data: Any, tool_interception_url: str | None = None) -> InProcessChatSession:
        """A session that keeps the rollout's exact wire messages across turns (see the module docstring)."""
        return InProcessChatSession(self, ctx, trace, runtime, endpoint, secret, mcp_urls, data, tool_interception_url)

    async def launch(self, ctx: Any, trace: Any, runtime: Any, endpoint: str, secret: str, mcp_urls: dict[str, str],
                     data: Any, tool_interception_url: str | None = None) -> ProgramResult:
        """One segment on ``data``'s prompt in a fresh session (verifiers' relaunch path; rollouts use :meth:`session`)."""
        session = await self.session(ctx, trace, runtime, endpoint, secret, mcp_urls, data, tool_interception_url)
        try:
            return await session._run(None)
        finally:
            await session.close()
