"""The Host check that stops DNS rebinding on a gateway without tokens.

With no token configured the gateway serves only on loopback and trusts whoever reaches it. A web
page the operator opens can still reach it: its own host name re-pointed at 127.0.0.1 (DNS
rebinding) makes the browser send requests, and read the answers, with ``Host: evil.example``.
:class:`HostCheck` answers any request whose Host is not a loopback name or address
(``localhost``, ``*.localhost``, 127.0.0.0/8, ``::1``) or a configured name (the host of
``base_url``, ``allowed_hosts``) with 421 Misdirected Request, in OpenAI's error shape.

A gateway with tokens skips the check: its tokens are the defence, and it may sit behind any name.
It does not parse anything but the Host header (the port is ignored; an IPv6 literal keeps its
brackets), and a request without a Host header (HTTP/1.0) is served.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from urllib.parse import urlsplit

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from swarm.web.settings import is_loopback

__all__ = ["HostCheck", "host_name"]


def host_name(host: str) -> str:
    """The name part of a Host header value, lower-cased (``[::1]:80`` -> ``::1``; ``a.b:1`` -> ``a.b``)."""
    # urlsplit knows bracketed IPv6 literals and ports; a malformed value gives no hostname. It would also
    # read "evil.example@127.0.0.1" or "127.0.0.1/x" as loopback: a Host header holds a name and a port only
    if any(ch in host for ch in "@/?#\\ \t"):
        return ""
    try:
        return (urlsplit(f"//{host}").hostname or "").rstrip(".")
    except ValueError:
        return ""


class HostCheck:
    """Serves only requests whose Host is loopback or one of ``allowed`` (names, lower case)."""

    def __init__(self, app: ASGIApp, allowed: Iterable[str] = ()) -> None:
        self.app = app
        self.allowed = {a.lower().strip("[]").rstrip(".") for a in allowed if a}
        self._seen: dict[str, bool] = {}  # Host value -> verdict: parsing it costs more than the rest of the check

    def ok(self, host: str | None) -> bool:
        if host is None:
            return True
        verdict = self._seen.get(host)
        if verdict is None:
            name = host_name(host)
            verdict = bool(name) and (name in self.allowed or name.endswith(".localhost") or is_loopback(name))
            if len(self._seen) < 1024:  # a client sending ever new Host values gets no memory of them
                self._seen[host] = verdict
        return verdict

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket") or self.ok(Headers(scope=scope).get("host")):
            return await self.app(scope, receive, send)
        body = json.dumps({"error": {
            "message": "this gateway has no tokens and serves loopback Host names only (localhost, 127.0.0.1, "
                       "[::1]) or those in GatewaySettings.allowed_hosts; set tokens to serve other names",
            "type": "invalid_request_error", "param": None, "code": "host_not_allowed"}}).encode()
        await send({"type": "http.response.start", "status": 421,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})
