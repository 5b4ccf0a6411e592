"""The engine client's two paths (swarm/policy/_http.py): aiohttp directly, and httpx with an injected transport.

A real loopback server answers both; the same calls must give the same events, answers and errors either way.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from swarm.errors import BackendError, ContextLengthError
from swarm.policy._http import EngineClient, _events, _lines, post_json, sse_reads
from swarm.stack import ServerThread

EVENTS = [{"choices": [{"index": 0, "text": "h\u00e9llo"}]}, {"choices": [{"index": 0, "text": " w\u00f6rld"}]}]


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    app = FastAPI()

    @app.post("/v1/echo")
    async def echo(request: Request) -> Any:
        body = await request.json()
        if body.get("fail") == "context":
            return JSONResponse({"error": {"message": "maximum context length is 64 tokens"}}, status_code=400)
        if body.get("fail"):
            return JSONResponse({"error": {"message": "scripted"}}, status_code=503)
        if not body.get("stream"):
            return {"got": body, "auth": request.headers.get("authorization")}

        def events() -> Iterator[bytes]:
            # split bytes: a CRLF and a two-byte character across chunks, a comment line, then [DONE]
            raw = "".join(f"data: {json.dumps(e, ensure_ascii=False)}\r\n\r\n" for e in EVENTS).encode()
            raw = b": keep-alive\n" + raw + b"data: [DONE]\n\n"
            cut = raw.index("\u00e9".encode()) + 1
            yield from (raw[:cut], raw[cut:cut + 40], raw[cut + 40:])

        return StreamingResponse(events(), media_type="text/event-stream")

    srv = ServerThread(app).start()
    yield srv.url + "/v1"
    srv.stop()


def _clients(url: str) -> list[EngineClient]:
    direct = EngineClient(url, {"Authorization": "Bearer k"}, 10.0)
    via_httpx = EngineClient(url, {"Authorization": "Bearer k"}, 10.0,
                             transport=httpx.AsyncHTTPTransport())  # an injected transport: the httpx path
    assert direct.direct and not via_httpx.direct
    return [direct, via_httpx]


def test_both_paths_give_the_same_answers_events_and_errors(server: str) -> None:
    async def run(client: EngineClient) -> list[Any]:
        try:
            out: list[Any] = [await post_json(client, "/echo", {"x": "\u00e9", "n": 1})]
            out.append([e async for es in sse_reads(client, "/echo", {"stream": True}) for e in es])
            for fail in ("context", "yes"):
                with pytest.raises(BackendError) as err:
                    await post_json(client, "/echo", {"fail": fail})
                out.append((type(err.value), str(err.value)))
                with pytest.raises(BackendError) as err:
                    _ = [e async for e in sse_reads(client, "/echo", {"fail": fail, "stream": True})]
                out.append((type(err.value), str(err.value)))
            return out
        finally:
            await client.close_loop()
            await client.aclose()

    direct, via_httpx = (asyncio.run(run(c)) for c in _clients(server))
    assert direct == via_httpx
    assert direct[0] == {"got": {"x": "\u00e9", "n": 1}, "auth": "Bearer k"}
    assert direct[1] == EVENTS
    assert direct[2][0] is ContextLengthError and direct[4][0] is BackendError and "503" in direct[4][1]


def test_the_proxy_variables_are_read_once_and_honoured_by_every_call(
        server: str, monkeypatch: pytest.MonkeyPatch) -> None:
    async def run(client: EngineClient) -> list[Any]:
        try:  # a generation (aiohttp directly) and another call (httpx's API over the same session)
            return [await post_json(client, "/echo", {"via": "proxy"}), (await client.post("/echo", json={})).json()]
        finally:
            await client.close_loop()
            await client.aclose()

    # the loopback server stands in for a forward proxy: it gets the absolute-form request for a host that has no
    # address and answers it; with NO_PROXY naming that host the calls go direct, and fail
    url = "http://engine.invalid/v1"
    for name in ("http_proxy", "https_proxy", "all_proxy", "no_proxy", "HTTPS_PROXY", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)  # a machine's own settings (lowercase ones win) stay out
    monkeypatch.setenv("HTTP_PROXY", server.removesuffix("/v1"))
    monkeypatch.setenv("NO_PROXY", "localhost")
    proxied = EngineClient(url, {"Authorization": "Bearer k"}, 10.0)
    monkeypatch.setenv("NO_PROXY", "engine.invalid")
    bypassed = EngineClient(url, {"Authorization": "Bearer k"}, 10.0)
    monkeypatch.setenv("NO_PROXY", "localhost")  # read when made: a later change does not move a made client
    assert asyncio.run(run(proxied)) == [{"got": {"via": "proxy"}, "auth": "Bearer k"}, {"got": {}, "auth": "Bearer k"}]
    with pytest.raises(BackendError, match="upstream request failed"):
        asyncio.run(run(bypassed))


def test_an_unreachable_engine_is_a_backend_error_on_both_paths() -> None:
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}/v1"

    async def run(client: EngineClient) -> str:
        try:
            with pytest.raises(BackendError, match="upstream request failed") as err:
                await post_json(client, "/echo", {})
            with pytest.raises(BackendError, match="upstream request failed"):
                _ = [e async for es in sse_reads(client, "/echo", {"stream": True}) for e in es]
            return str(err.value)
        finally:
            await client.close_loop()
            await client.aclose()

    for client in _clients(url):
        assert asyncio.run(run(client))


def test_lines_split_as_httpx_splits_them() -> None:
    chunks = [b"a\r", b"\nb\n", b"c\xc3", b"\xa9\rd", b"\n\n", b"tail"]

    async def ours() -> list[str]:
        async def gen() -> AsyncIterator[bytes]:
            for c in chunks:
                yield c
        return [line async for lines in _lines(gen()) for line in lines]

    async def theirs() -> list[str]:
        resp = httpx.Response(200, content=b"".join(chunks))
        return [line async for line in resp.aiter_lines()]

    got = asyncio.run(ours())
    # the same text lines; a CRLF split over two reads may add one empty line (SSE ignores empty lines)
    assert [x for x in got if x] == [x for x in asyncio.run(theirs()) if x] == ["a", "b", "c\u00e9", "d", "tail"]


def test_the_events_of_one_read_come_together() -> None:
    """What one network read brought is one group (a gateway that fell behind relays it as one piece)."""
    one = b"".join(f"data: {json.dumps(e)}\n\n".encode() for e in EVENTS)
    chunks = [one, b"data: {\"choices\": []}\n", b"\ndata: [DONE]\n\ndata: {\"never\": 1}\n\n"]

    async def groups() -> list[list[dict]]:
        async def gen() -> AsyncIterator[bytes]:
            for c in chunks:
                yield c
        return [events async for events in _events(_lines(gen()))]

    assert asyncio.run(groups()) == [EVENTS, [{"choices": []}]]  # nothing after [DONE]


def test_coalesced_joins_each_choices_deltas_and_keeps_every_token_in_order() -> None:
    from swarm.policy.base import TokenDelta, coalesced

    def d(i: int, ids: list[int], text: str, lp: bool = True) -> TokenDelta:
        return TokenDelta(index=i, token_ids=ids, logprobs=[-0.5] * len(ids) if lp else None, text=text,
                          logprobs_content=[{"token": str(t)} for t in ids] if lp else None)

    got = coalesced([d(0, [1], "a"), d(1, [7], "x"), d(0, [2, 3], "bc"), d(1, [8], "y", lp=False), d(0, [4], "d")])
    assert [(g.index, g.token_ids, g.text, g.logprobs) for g in got] == [
        (0, [1, 2, 3, 4], "abcd", [-0.5] * 4), (1, [7], "x", [-0.5]),
        (1, [8], "y", None)]  # a delta without logprobs does not join one with them
    assert [e["token"] for e in got[0].logprobs_content] == ["1", "2", "3", "4"]
    assert coalesced([]) == []
