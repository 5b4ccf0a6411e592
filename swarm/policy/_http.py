"""HTTP helpers shared by the ``upstream`` and ``vllm`` clients: errors, SSE, token-id parsing.

Maps transport failures and non-2xx answers to :class:`~swarm.errors.BackendError` (a context
overflow reported by the server to :class:`~swarm.errors.ContextLengthError`), reads
``text/event-stream`` bodies, and reads vLLM's ``token_id:<n>`` token strings. No retries here:
a failed generation is reported, not repeated behind the caller's back.
"""

from __future__ import annotations

import asyncio
import json
import weakref
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import httpx
from httpx_aiohttp import AiohttpTransport

from swarm.errors import BackendError, ContextLengthError

__all__ = ["raise_for_status", "sse_events", "token_id", "post_json", "backend_error", "LIMITS", "async_transport"]

# Every connection to the engine / upstream is kept alive between calls. httpx keeps 20 by default: at more
# concurrent calls than that, every call past the 20th opened a connection (a name lookup on a worker thread, a TCP
# handshake) and closed it after (docs/gateway.md "Side by side with LiteLLM's proxy"). The number of connections
# open at once is still bounded by the calls in flight, i.e. by the gateway's own connection limits.
# An idle connection is dropped after 2 s, before the server drops it: vLLM's server closes idle connections after 5 s
# (VLLM_HTTP_TIMEOUT_KEEP_ALIVE), httpx's default expiry is also 5 s, and a call sent on a connection the server was
# closing at that moment failed with "Server disconnected without sending a response" (CI: /load_lora_adapter, the
# first call after a training update of about 5 s).
LIMITS = httpx.Limits(max_connections=None, max_keepalive_connections=None, keepalive_expiry=2.0)


class _LoopTransport(httpx.AsyncBaseTransport):
    """httpx's API over aiohttp's HTTP/1.1 client (httpx-aiohttp), one aiohttp session per event loop.

    httpx's own transport (httpcore through anyio) cost 1.2 CPU-ms a call at one client and 2.2 at 32 concurrent calls
    on loopback; over aiohttp's C parser the same calls cost 0.7 and 0.8 (docs/gateway.md "Side by side with LiteLLM's
    proxy"). An aiohttp session belongs to the loop it was made in, so each running loop gets its own (a backend is
    normally used from the gateway's one loop; tests and tools may drive it from several). Connections follow
    :data:`LIMITS`: no cap (aiohttp's ``limit=0``), idle ones closed after ``keepalive_expiry``.
    """

    def __init__(self) -> None:
        self._by_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, AiohttpTransport] = weakref.WeakKeyDictionary()

    def _for_loop(self) -> AiohttpTransport:
        loop = asyncio.get_running_loop()
        transport = self._by_loop.get(loop)
        if transport is None:
            def session() -> aiohttp.ClientSession:
                connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=LIMITS.keepalive_expiry)
                return aiohttp.ClientSession(connector=connector)

            transport = self._by_loop[loop] = AiohttpTransport(limits=LIMITS, client=session)
        return transport

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        return await self._for_loop().handle_async_request(request)

    async def aclose(self) -> None:
        transport = self._by_loop.pop(asyncio.get_running_loop(), None)
        if transport is not None:
            await transport.aclose()


def async_transport(transport: httpx.AsyncBaseTransport | None = None) -> httpx.AsyncBaseTransport:
    """The transport of the engine / upstream async clients: ``transport`` when given (tests), else aiohttp's."""
    return transport if transport is not None else _LoopTransport()

_CONTEXT_HINTS = ("context length", "maximum context", "context_length", "too long", "max_model_len")


def _message(resp: httpx.Response) -> str:
    try:
        body = resp.json()
    except ValueError:
        return resp.text[:500]
    err = body.get("error", body) if isinstance(body, dict) else body
    if isinstance(err, dict):
        return str(err.get("message") or err.get("detail") or err)[:500]
    return str(err)[:500]


def raise_for_status(resp: httpx.Response, **context: Any) -> None:
    """Raise a swarm error for a non-2xx response (after the body was read)."""
    if resp.is_success:
        return
    msg = _message(resp)
    if resp.status_code == 400 and any(h in msg.lower() for h in _CONTEXT_HINTS):
        raise ContextLengthError(f"upstream: {msg}", **context)
    raise BackendError(f"upstream answered {resp.status_code}: {msg}", status=resp.status_code, **context)


def backend_error(e: httpx.HTTPError, url: str) -> BackendError:
    return BackendError(f"upstream request failed: {type(e).__name__}: {e}", url=url)


async def post_json(client: httpx.AsyncClient, path: str, body: dict[str, Any], **context: Any) -> dict[str, Any]:
    """POST JSON, return the decoded JSON answer; every failure is a swarm error."""
    try:
        resp = await client.post(path, json=body)
    except httpx.HTTPError as e:
        raise backend_error(e, str(client.base_url).rstrip("/") + path) from e
    raise_for_status(resp, **context)
    try:
        return resp.json()
    except ValueError as e:
        raise BackendError(f"upstream returned invalid JSON: {resp.text[:200]}", **context) from e


async def sse_events(client: httpx.AsyncClient, path: str, body: dict[str, Any], **context: Any) -> AsyncIterator[dict]:
    """POST with ``stream: true`` and yield each ``data:`` JSON event until ``[DONE]``."""
    try:
        async with client.stream("POST", path, json=body) as resp:
            if not resp.is_success:
                await resp.aread()
                raise_for_status(resp, **context)
            async for line in resp.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    return
                try:
                    event = json.loads(data)
                except ValueError as e:
                    raise BackendError(f"upstream sent an invalid event: {data[:200]}", **context) from e
                if isinstance(event, dict) and "error" in event and "choices" not in event:
                    raise BackendError(f"upstream stream error: {event['error']}", **context)
                yield event
    except httpx.HTTPError as e:
        raise backend_error(e, str(client.base_url).rstrip("/") + path) from e


def token_id(token: Any) -> int | None:
    """The id in vLLM's ``token_id:<n>`` token strings (``return_tokens_as_token_ids``), else None."""
    if isinstance(token, str) and token.startswith("token_id:"):
        try:
            return int(token[9:])
        except ValueError:
            return None
    return None
