"""The fast lane: the gateway's hot routes served without FastAPI's per-request machinery, same checks, same answers.

An agent's episode is ``POST /v1/episodes``, a chat call per turn, ``POST /v1/episodes/{id}/end``. Through FastAPI each
of them crosses a dozen ASGI layers (error middlewares, router matching over every route, dependency solving,
``request_response`` wrappers), and every ``await`` inside the handler (the batched head read, the group commit)
resumes that whole chain of coroutines again: measured on the null backend, about a third of the gateway's CPU per
recorded step (docs/gateway.md, "What a request costs"). :class:`FastLane` recognises those three routes at the
app's door (:class:`swarm.app.GatewayApp`) and calls the same route code directly:

- the same checks, in the same order: the Host check of a gateway without tokens, the body limit, the body parsed by
  the same ``json.loads`` FastAPI uses and validated by the same pydantic model (its hostile-input checks included),
  the same credential check (:class:`~swarm.web.state.ServiceState`), then the route's own function;
- anything unusual *before* the route's function runs (a query string, another content type, a body that does not
  parse or validate, a bad or missing key, a foreign Host, a body over the limit, an app whose middleware or
  dependency overrides were changed after :func:`swarm.app.create_app`) is handed to the ordinary FastAPI path with
  the body replayed, so every refusal is the one FastAPI gives, word for word;
- once the route's function runs, its errors are answered by the app's own exception handlers (looked up by the
  exception's class like Starlette does), and its response is sent as FastAPI sends it (``JSONResponse`` of the
  returned dict, or the route's own response object).

It adds no route and changes no answer; ``/openapi.json`` still describes these routes (they stay registered). It does
not cover streaming uploads, other routes, or apps that add middleware after ``create_app`` (they take the FastAPI path).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse
from starlette.responses import Response
from starlette.types import Message, Receive, Scope, Send

from swarm.gateway import routes_episodes, routes_openai
from swarm.gateway.hosts import HostCheck
from swarm.gateway.schemas import ChatCompletionRequest, EpisodeCreate, EpisodeEnd
from swarm.gateway.state import GatewayState

__all__ = ["FastLane"]

log = logging.getLogger("swarm.gateway")

ASGI = Callable[[Scope, Receive, Send], Awaitable[None]]
_END = re.compile(r"^/v1/episodes/([^/]+)/end$")
_PATHS = ("/v1/chat/completions", "/v1/episodes")


class FastLane:
    """Serves chat calls, episode opens and ends straight from the route functions (see the module docstring)."""

    def __init__(self, app: Any, state: GatewayState, host_check: HostCheck | None, limit: int) -> None:
        self.app = app  # the FastAPI app: its exception handlers, overrides and middleware list are consulted
        self.state = state
        self.host_check = host_check
        self.limit = limit
        self.middleware = list(app.user_middleware)  # as create_app left it; a later change turns the lane off
        self.served = 0  # requests answered here (tests, benchmarks)

    def wants(self, scope: Scope) -> bool:
        """Whether this request may be tried here (cheap checks on the scope only)."""
        if scope["type"] != "http" or scope["method"] != "POST" or scope.get("query_string") or scope.get("root_path"):
            return False
        path = scope["path"]
        if path not in _PATHS and not (path.startswith("/v1/episodes/") and path.endswith("/end")):
            return False
        app = self.app
        return not app.dependency_overrides and app.user_middleware == self.middleware

    async def __call__(self, scope: Scope, receive: Receive, send: Send, fallback: ASGI) -> None:
        headers = _headers(scope)
        body, held, complete = await self._read(headers, receive)
        replay = _replay(body, held, complete, receive)
        if not complete or not _json_type(headers.get(b"content-type")) or (
                self.host_check is not None and not self.host_check.ok(_latin(headers.get(b"host")))):
            return await fallback(scope, replay, send)
        try:
            run = self._prepare(scope, body, replay)
        except Exception:  # noqa: BLE001 - a refusal (validation, auth, malformed JSON): FastAPI's path words it
            return await fallback(scope, replay, send)
        try:
            response = await run.call()
        except Exception as exc:  # noqa: BLE001 - answered by the app's own handler for it, as FastAPI would
            response = await self._handled(run.request, exc)
        self.served += 1
        await response(scope, replay, send)

    # ------------------------------------------------------------------ steps
    async def _read(self, headers: dict[bytes, bytes], receive: Receive) -> tuple[bytes, Message | None, bool]:
        """(the body read so far, a non-body message that arrived, whether the body is complete and in the limit).

        A body declared or found over the limit is read no further: the FastAPI path refuses it (413)."""
        declared = headers.get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.limit):
            return b"", None, False
        chunks: list[bytes] = []
        seen = 0
        while True:
            msg = await receive()
            if msg["type"] != "http.request":  # the client went away mid-body
                return b"".join(chunks), msg, False
            chunk = msg.get("body", b"")
            chunks.append(chunk)
            seen += len(chunk)
            more = msg.get("more_body", False)
            if seen > self.limit or not more:
                return b"".join(chunks), None, seen <= self.limit

    def _prepare(self, scope: Scope, body: bytes, receive: Receive) -> _Run:
        state, path = self.state, scope["path"]
        request = Request(scope, receive)
        data = json.loads(body)  # as FastAPI parses bodies: the same numbers, surrogates and NaN reach pydantic
        if path == "/v1/chat/completions":
            caller = state.episode_caller(request)
            chat = ChatCompletionRequest.model_validate(data)
            return _Run(request, lambda: routes_openai.chat_completions(chat, request, caller, state))
        if path == "/v1/episodes":
            caller = state.client_caller(request)
            create = EpisodeCreate.model_validate(data)
            return _Run(request, lambda: _json(routes_episodes.create_episode(create, request, caller, state)))
        m = _END.match(path)
        if m is None or "\x00" in path or not isinstance(data, dict):
            raise LookupError(path)  # FastAPI's path: another route, or BodyLimit's refusal of NUL
        episode_id = m.group(1)
        caller = state.any_caller(request)
        end = EpisodeEnd.model_validate(data)
        return _Run(request, lambda: _json(routes_episodes.end_episode(episode_id, end, caller, state)))

    async def _handled(self, request: Request, exc: Exception) -> Response:
        handlers = self.app.exception_handlers
        for cls in type(exc).__mro__:
            handler = handlers.get(cls)
            if handler is not None:
                return await handler(request, exc)
        raise exc


class _Run:
    __slots__ = ("request", "call")

    def __init__(self, request: Request, call: Callable[[], Awaitable[Response]]) -> None:
        self.request, self.call = request, call


async def _json(result: Awaitable[dict[str, Any]]) -> Response:
    return JSONResponse(await result)  # the route returns JSON-ready values (FastAPI's encoder changes nothing)


def _headers(scope: Scope) -> dict[bytes, bytes]:
    """Header names to their first value (what Starlette's ``Headers.get`` answers)."""
    out: dict[bytes, bytes] = {}
    for name, value in scope["headers"]:
        out.setdefault(name, value)
    return out


def _json_type(value: bytes | None) -> bool:
    return value is not None and value.split(b";", 1)[0].strip().lower() == b"application/json"


def _latin(value: bytes | None) -> str | None:
    return None if value is None else value.decode("latin-1")


def _replay(body: bytes, held: Message | None, complete: bool, receive: Receive) -> Receive:
    """A ``receive`` that hands out what was read (the body so far, then a held message), then the client's own."""
    queue: list[Message] = []
    if body or complete or held is not None:
        queue.append({"type": "http.request", "body": body, "more_body": not complete and held is None})
    if held is not None:
        queue.append(held)

    async def again() -> Message:
        if queue:
            return queue.pop(0)
        return await receive()

    return again
