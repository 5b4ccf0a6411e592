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
import yarl
from aiohttp.helpers import get_env_proxy_for_url
from httpx_aiohttp import AiohttpTransport

from swarm.errors import BackendError, ContextLengthError

__all__ = ["raise_for_status", "sse_reads", "token_id", "post_json", "backend_error", "LIMITS", "EngineClient"]

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

    def __init__(self, proxy: httpx.Proxy | None = None) -> None:
        self.proxy = proxy
        self._by_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, AiohttpTransport] = weakref.WeakKeyDictionary()

    def _for_loop(self) -> AiohttpTransport:
        loop = asyncio.get_running_loop()
        transport = self._by_loop.get(loop)
        if transport is None:
            connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=LIMITS.keepalive_expiry)
            # no trust_env: it made every call look up ~/.netrc and the proxy variables on two worker threads
            # (EngineClient resolves the proxy once instead)
            session = aiohttp.ClientSession(connector=connector)
            transport = self._by_loop[loop] = AiohttpTransport(limits=LIMITS, client=session, proxy=self.proxy)
        return transport

    def session(self) -> aiohttp.ClientSession:
        """The running loop's aiohttp session (httpx's calls go over it too)."""
        return self._for_loop().client  # type: ignore[return-value]

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        return await self._for_loop().handle_async_request(request)

    async def aclose(self) -> None:
        transport = self._by_loop.pop(asyncio.get_running_loop(), None)
        if transport is not None:
            await transport.aclose()


class EngineClient(httpx.AsyncClient):
    """The async client of one engine / upstream: httpx's API over aiohttp; the generation calls skip httpx.

    Without a ``transport`` (production) every call goes over :class:`_LoopTransport`, and :func:`post_json` and
    :func:`sse_reads` (every generation the gateway forwards) call aiohttp directly with the same URL, headers and
    timeouts: httpx's request and response objects over aiohttp cost more CPU per call than the aiohttp call itself
    (docs/gateway.md "Side by side with LiteLLM's proxy"). With a ``transport`` (tests inject ``httpx.MockTransport``)
    every call goes through httpx to it. Both paths share the error mapping and the SSE line reader.
    """

    def __init__(self, base_url: str, headers: dict[str, str], timeout_s: float,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        # HTTP(S)_PROXY / NO_PROXY for this engine's address, resolved once (see _env_proxy)
        self._proxy, self._proxy_auth = _env_proxy(base_url)
        proxy = None if self._proxy is None else httpx.Proxy(
            str(self._proxy), auth=None if self._proxy_auth is None else (self._proxy_auth.login,
                                                                          self._proxy_auth.password))
        self._loops = _LoopTransport(proxy) if transport is None else None
        super().__init__(base_url=base_url, headers=headers, transport=transport or self._loops,
                         timeout=httpx.Timeout(timeout_s), limits=LIMITS)
        self._url = base_url.rstrip("/")
        self._post_headers = {**headers, "Content-Type": "application/json"}
        self._aio_timeout = aiohttp.ClientTimeout(total=None, sock_connect=timeout_s, sock_read=timeout_s)

    @property
    def direct(self) -> bool:
        """Whether the generation calls go over aiohttp directly (no transport was injected)."""
        return self._loops is not None

    def post_direct(self, path: str, body: dict[str, Any]) -> Any:
        """aiohttp's POST of ``body`` as JSON (encoded as httpx encodes it) to ``path``: an async context manager."""
        assert self._loops is not None, "post_direct needs the aiohttp transport"
        return self._loops.session().post(self._url + path, data=_json_bytes(body), headers=self._post_headers,
                                          timeout=self._aio_timeout, allow_redirects=False, proxy=self._proxy,
                                          proxy_auth=self._proxy_auth)

    async def close_loop(self) -> None:
        """Close the running event loop's connections (the client stays usable from this or another loop)."""
        if self._loops is not None:
            await self._loops.aclose()


def _env_proxy(url: str) -> tuple[yarl.URL | None, aiohttp.BasicAuth | None]:
    """The proxy that ``HTTP(S)_PROXY`` / ``NO_PROXY`` name for ``url`` (and its credentials), or ``(None, None)``.

    Resolved by aiohttp's own rules, once, when the client is made (httpx too reads them once): aiohttp's
    ``trust_env`` resolved them, and looked up ``~/.netrc``, again on worker threads at every call (two thread hops a
    generation).
    """
    try:
        return get_env_proxy_for_url(yarl.URL(url))
    except LookupError:  # none set, or NO_PROXY names this host
        return None, None


def _json_bytes(body: dict[str, Any]) -> bytes:
    """A request body as httpx's ``json=`` encodes it (compact, UTF-8, no NaN)."""
    return json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()


_CONTEXT_HINTS = ("context length", "maximum context", "context_length", "too long", "max_model_len")
# what a failed call raises on either path: httpx's errors, aiohttp's (a timeout is asyncio's TimeoutError)
_CALL_ERRORS = (httpx.HTTPError, aiohttp.ClientError, asyncio.TimeoutError)


def _message(content: bytes) -> str:
    try:
        body = json.loads(content)
    except ValueError:
        return content.decode("utf-8", "replace")[:500]
    err = body.get("error", body) if isinstance(body, dict) else body
    if isinstance(err, dict):
        return str(err.get("message") or err.get("detail") or err)[:500]
    return str(err)[:500]


def _raise_for(status: int, content: bytes, **context: Any) -> None:
    """Raise a swarm error for a non-2xx status with this body."""
    if 200 <= status < 300:
        return
    msg = _message(content)
    if status == 400 and any(h in msg.lower() for h in _CONTEXT_HINTS):
        raise ContextLengthError(f"upstream: {msg}", **context)
    raise BackendError(f"upstream answered {status}: {msg}", status=status, **context)


def raise_for_status(resp: httpx.Response, **context: Any) -> None:
    """Raise a swarm error for a non-2xx response (after the body was read)."""
    _raise_for(resp.status_code, resp.content, **context)


def backend_error(e: BaseException, url: str) -> BackendError:
    return BackendError(f"upstream request failed: {type(e).__name__}: {e}", url=url)


def _decoded(content: bytes, **context: Any) -> dict[str, Any]:
    try:
        return json.loads(content)
    except ValueError as e:
        text = content.decode("utf-8", "replace")
        raise BackendError(f"upstream returned invalid JSON: {text[:200]}", **context) from e


async def post_json(client: httpx.AsyncClient, path: str, body: dict[str, Any], **context: Any) -> dict[str, Any]:
    """POST JSON, return the decoded JSON answer; every failure is a swarm error."""
    try:
        if isinstance(client, EngineClient) and client.direct:
            async with client.post_direct(path, body) as resp:
                status, content = resp.status, await resp.read()
        else:
            resp = await client.post(path, json=body)
            status, content = resp.status_code, resp.content
    except _CALL_ERRORS as e:
        raise backend_error(e, str(client.base_url).rstrip("/") + path) from e
    _raise_for(status, content, **context)
    return _decoded(content, **context)


async def sse_reads(client: httpx.AsyncClient, path: str, body: dict[str, Any], **context: Any) -> AsyncIterator[list[dict]]:
    """POST with ``stream: true``; the ``data:`` JSON events until ``[DONE]``, those of one network read together.

    A reader that keeps up gets one event a read; one that fell behind (a busy gateway) gets what arrived meanwhile
    in one list, and may relay it as one piece instead of paying a downstream write per event."""
    try:
        if isinstance(client, EngineClient) and client.direct:
            async with client.post_direct(path, body) as resp:
                if not 200 <= resp.status < 300:
                    _raise_for(resp.status, await resp.read(), **context)
                async for events in _events(_lines(resp.content.iter_any()), **context):
                    yield events
        else:
            async with client.stream("POST", path, json=body) as resp:
                if not resp.is_success:
                    await resp.aread()
                    raise_for_status(resp, **context)
                async for events in _events(_lines(resp.aiter_bytes()), **context):
                    yield events
    except _CALL_ERRORS as e:
        raise backend_error(e, str(client.base_url).rstrip("/") + path) from e


async def _lines(chunks: AsyncIterator[bytes]) -> AsyncIterator[list[str]]:
    """The text lines of a byte stream (``\\n``, ``\\r\\n`` or ``\\r`` ended, as httpx's ``aiter_lines`` splits), those
    that one chunk completed together."""
    rest = b""
    async for chunk in chunks:
        lines = (rest + chunk).splitlines(keepends=True)
        rest = lines.pop() if lines and not lines[-1].endswith((b"\n", b"\r")) else b""
        if lines:
            yield [line.rstrip(b"\r\n").decode("utf-8", "replace") for line in lines]
    if rest:
        yield [rest.decode("utf-8", "replace")]


async def _events(groups: AsyncIterator[list[str]], **context: Any) -> AsyncIterator[list[dict]]:
    """The ``data:`` JSON events of groups of SSE lines (a group's together) until ``[DONE]``; an error event is a
    swarm error."""
    async for lines in groups:
        events = []
        for line in lines:
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                if events:
                    yield events
                return
            try:
                event = json.loads(data)
            except ValueError as e:
                if events:  # what came before a failure is relayed first, as it would have been alone
                    yield events
                raise BackendError(f"upstream sent an invalid event: {data[:200]}", **context) from e
            if isinstance(event, dict) and "error" in event and "choices" not in event:
                if events:
                    yield events
                raise BackendError(f"upstream stream error: {event['error']}", **context)
            events.append(event)
        if events:
            yield events


def token_id(token: Any) -> int | None:
    """The id in vLLM's ``token_id:<n>`` token strings (``return_tokens_as_token_ids``), else None."""
    if isinstance(token, str) and token.startswith("token_id:"):
        try:
            return int(token[9:])
        except ValueError:
            return None
    return None
