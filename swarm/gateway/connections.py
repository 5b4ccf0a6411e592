"""Connection hygiene for the gateway's uvicorn servers: timeouts, a connection cap, quiet logs.

uvicorn (0.55) times out only idle keep-alive connections *after* a response: a fresh
connection that sends nothing, a request head sent a byte at a time and a body sent at 1 byte/s
are held forever, and past the descriptor limit asyncio logs one ``accept()`` traceback per try.
:func:`uvicorn_config` builds the ``uvicorn.Config`` both serving paths use
(:class:`swarm.stack.ServerThread` and ``flows/serve.py``) with :class:`GuardedProtocol`, uvicorn's
httptools (llhttp, C) protocol with these guards: it costs ~10% less CPU per recorded step than uvicorn's
pure-Python h11 one (docs/gateway.md "What a request costs"):

- a new connection must start a request within ``timeout_keep_alive_s`` (as between requests);
- once a request's first byte arrives, its head must be complete within ``timeout_request_head_s``
  (a slowloris client is disconnected), and its body within ``timeout_request_body_s``;
- one client address holding ``max_connections_per_client`` connections gets a 503 for the next
  one, closed before anything is read: a single host (slowloris, idle sockets) cannot take the
  ``limit_concurrency`` slots every other agent needs;
- above ``limit_concurrency`` open connections or running requests, uvicorn answers 503 at once;
  above ``max_connections`` a new connection gets a 503 and is closed before anything is read
  (so descriptors stay free for the pool and ``/health``);
- request heads larger than ``max_request_head_bytes`` are a 400 and the connection is closed (counted over
  the bytes read while a head is incomplete; llhttp itself has no limit).

Every refusal and timeout is logged through :class:`RateLimitedLog` (one line per kind per
interval, with a count); uvicorn's own "Exceeded concurrency limit." / "Invalid HTTP request
received." warnings and asyncio's ``accept()`` errors go through :class:`RateLimitFilter`.
It does not rate-limit requests per client (that is a proxy's job), it counts clients by their address
as the socket sees it (behind a proxy, all clients are the proxy) and it serves HTTP/1.1 only.
"""

from __future__ import annotations

import asyncio
import logging
import resource
import threading
import time
from typing import Any

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

__all__ = ["GuardedProtocol", "RateLimitedLog", "RateLimitFilter", "guarded_protocol", "uvicorn_config",
           "install_log_filters", "raise_fd_limit"]

log = logging.getLogger("swarm.gateway.connections")

_REFUSED = (b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nconnection: close\r\n"
            b"content-length: 98\r\n\r\n"
            b'{"error": {"message": "too many connections", "type": "server_busy", "param": null, "code": null}}')
assert len(_REFUSED.split(b"\r\n\r\n", 1)[1]) == 98
_BODY_PER_CLIENT = (b'{"error": {"message": "too many connections from this address", "type": "server_busy", '
                    b'"param": null, "code": "too_many_connections_per_client"}}')
_REFUSED_PER_CLIENT = (b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nconnection: close\r\n"
                       b"content-length: " + str(len(_BODY_PER_CLIENT)).encode() + b"\r\n\r\n" + _BODY_PER_CLIENT)
_BODY_HEAD = (b'{"error": {"message": "request head too large (GatewaySettings.max_request_head_bytes)", '
              b'"type": "invalid_request_error", "param": null, "code": "request_head_too_large"}}')
_HEAD_TOO_LARGE = (b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\nconnection: close\r\n"
                   b"content-length: " + str(len(_BODY_HEAD)).encode() + b"\r\n\r\n" + _BODY_HEAD)


class RateLimitedLog:
    """Counts events by kind and logs at most one line per kind every ``interval_s`` seconds."""

    def __init__(self, logger: logging.Logger = log, interval_s: float = 60.0) -> None:
        self.logger, self.interval_s = logger, interval_s
        self.counts: dict[str, int] = {}  # kind -> events since the process started
        self._pending: dict[str, int] = {}
        self._last: dict[str, float] = {}
        self._lock = threading.Lock()

    def note(self, kind: str, message: str) -> None:
        """Record one ``kind`` event; log ``message`` (with the count since the last line) if due."""
        now = time.monotonic()
        with self._lock:
            self.counts[kind] = self.counts.get(kind, 0) + 1
            self._pending[kind] = self._pending.get(kind, 0) + 1
            if now - self._last.get(kind, -1e18) < self.interval_s:
                return
            n, self._pending[kind], self._last[kind] = self._pending[kind], 0, now
        self.logger.warning("%s (%d time(s) since the last such line; at most one line per %.0f s)",
                            message, n, self.interval_s)


class RateLimitFilter(logging.Filter):
    """Lets a record whose message starts with one of ``prefixes`` through at most once per interval."""

    def __init__(self, prefixes: tuple[str, ...], interval_s: float = 60.0) -> None:
        super().__init__()
        self.prefixes, self.interval_s = prefixes, interval_s
        self._last: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        msg = str(record.msg)
        prefix = next((p for p in self.prefixes if msg.startswith(p)), None)
        if prefix is None:
            return True
        now = time.monotonic()
        with self._lock:
            if now - self._last.get(prefix, -1e18) < self.interval_s:
                self._suppressed[prefix] = self._suppressed.get(prefix, 0) + 1
                return False
            self._last[prefix] = now
            n = self._suppressed.pop(prefix, 0)
        if n:
            record.msg = f"{msg} ({n} similar line(s) suppressed in the last {self.interval_s:.0f} s)"
        if prefix.startswith("socket.accept()"):
            record.exc_info = None  # the traceback says nothing the message does not
        return True


_FILTERED = {"uvicorn.error": ("Exceeded concurrency limit.", "Invalid HTTP request received."),
             "asyncio": ("socket.accept() out of system resource",)}


def install_log_filters(interval_s: float = 60.0) -> None:
    """Rate-limit uvicorn's refusal warnings and asyncio's accept() errors (idempotent, process-wide)."""
    for name, prefixes in _FILTERED.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, RateLimitFilter) for f in logger.filters):
            logger.addFilter(RateLimitFilter(prefixes, interval_s))


def raise_fd_limit(wanted: int) -> int:
    """Raise this process's soft descriptor limit towards ``wanted`` (within the hard limit); returns it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if target > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    return soft


class GuardedProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol plus request head / body deadlines, a head size limit and a hard connection cap.

    The limits come from class attributes set by :func:`guarded_protocol`.
    """

    timeout_request_head_s: float = 10.0
    timeout_request_body_s: float = 120.0
    max_connections: int = 2048
    max_connections_per_client: int = 512
    max_request_head_bytes: int = 32 * 1024
    per_client: dict[str, int] = {}  # open connections by client address (one dict per server class)
    events: RateLimitedLog = RateLimitedLog()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._head_timer: asyncio.TimerHandle | None = None
        self._body_timer: asyncio.TimerHandle | None = None
        self._body_cycle: Any = None
        self._in_head = False  # between a request's first byte and the end of its head (llhttp's callbacks)
        self._head_bytes = self._head_raw = 0
        self._head_too_large = False
        peer = transport.get_extra_info("peername")
        self._client_addr: str | None = str(peer[0]) if isinstance(peer, tuple) and peer else None
        if self._client_addr is not None and self.per_client.get(self._client_addr, 0) >= self.max_connections_per_client:
            self.transport = transport
            self._refused = True
            self._client_addr = None  # not counted
            transport.write(_REFUSED_PER_CLIENT)
            transport.close()
            self.events.note("refused_per_client", "gateway: refused a connection, its address already holds "
                                                   f"{self.max_connections_per_client} "
                                                   "(GatewaySettings.max_connections_per_client)")
            return
        if len(self.connections) >= self.max_connections:
            # answer before reading anything, and never join the server's connections
            self.transport = transport
            self._refused = True
            transport.write(_REFUSED)
            transport.close()
            self.events.note("refused", f"gateway: refused a connection, {self.max_connections} already open "
                                        "(GatewaySettings.max_connections)")
            self._client_addr = None
            return
        if self._client_addr is not None:
            self.per_client[self._client_addr] = self.per_client.get(self._client_addr, 0) + 1
        self._refused = False
        super().connection_made(transport)
        # uvicorn arms its idle timer only after a response: a connection that never speaks would stay
        self.timeout_keep_alive_task = self.loop.call_later(self.timeout_keep_alive, self.timeout_keep_alive_handler)

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timers()
        addr, self._client_addr = getattr(self, "_client_addr", None), None
        if addr is not None:
            n = self.per_client.get(addr, 1) - 1
            if n > 0:
                self.per_client[addr] = n
            else:
                self.per_client.pop(addr, None)
        if getattr(self, "_refused", False):
            return
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        if self._head_timer is None and (self.cycle is None or self.cycle.response_complete):
            # the first byte of a new request: its head must follow within the deadline
            self._head_timer = self.loop.call_later(self.timeout_request_head_s, self._head_timeout)
        super().data_received(data)
        self._track_cycle()
        if self._in_head and not self.transport.is_closing():  # a head still incomplete: its reads count too
            self._head_raw += len(data)
            if self._head_raw > self.max_request_head_bytes:
                self._head_too_large = True
                self.send_400_response("")

    # the head's size: its complete parts as llhttp hands them over, and (above) the reads of a head not yet complete
    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_head, self._head_bytes, self._head_raw, self._head_too_large = True, 0, 0, False

    def on_url(self, url: bytes) -> None:
        self._count_head(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count_head(len(name) + len(value) + 4)
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._in_head = False
        super().on_headers_complete()

    def _count_head(self, n: int) -> None:
        self._head_bytes += n
        if self._head_bytes > self.max_request_head_bytes:
            self._head_too_large = True
            raise ValueError("request head too large")  # llhttp stops; uvicorn answers with send_400_response

    def send_400_response(self, msg: str) -> None:
        if not getattr(self, "_head_too_large", False):
            super().send_400_response(msg)
            return
        self.events.note("head_too_large", "gateway: refused a request head over "
                                           f"{self.max_request_head_bytes} bytes (max_request_head_bytes)")
        self._cancel_timers()
        self.transport.write(_HEAD_TOO_LARGE)
        self.transport.close()

    def on_response_complete(self) -> None:
        self._cancel_timers()
        super().on_response_complete()

    def _track_cycle(self) -> None:
        cycle = self.cycle
        if cycle is None or cycle.response_complete:
            return
        if self._head_timer is not None:  # the head is complete: a request is running
            self._head_timer.cancel()
            self._head_timer = None
        if cycle.more_body and self._body_cycle is not cycle:
            self._body_cycle = cycle
            self._body_timer = self.loop.call_later(self.timeout_request_body_s, self._body_timeout)
        elif not cycle.more_body and self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None

    def _cancel_timers(self) -> None:
        for name in ("_head_timer", "_body_timer"):
            timer = getattr(self, name, None)
            if timer is not None:
                timer.cancel()
                setattr(self, name, None)

    def _head_timeout(self) -> None:
        self._head_timer = None
        if not self.transport.is_closing():
            self.events.note("slow_head", "gateway: closed a connection whose request head was not complete within "
                                          f"{self.timeout_request_head_s:g} s (timeout_request_head_s)")
            self.transport.close()

    def _body_timeout(self) -> None:
        self._body_timer = None
        if self.cycle is self._body_cycle and self.cycle.more_body and not self.transport.is_closing():
            self.events.note("slow_body", "gateway: closed a connection whose request body was not complete within "
                                          f"{self.timeout_request_body_s:g} s (timeout_request_body_s)")
            self.transport.close()


def guarded_protocol(settings: Any, events: RateLimitedLog | None = None) -> type[GuardedProtocol]:
    """A :class:`GuardedProtocol` subclass carrying ``settings``' limits (a GatewaySettings)."""
    return type("GatewayProtocol", (GuardedProtocol,), {
        "timeout_request_head_s": float(settings.timeout_request_head_s),
        "timeout_request_body_s": float(settings.timeout_request_body_s),
        "max_connections": int(settings.max_connections),
        "max_connections_per_client": int(settings.max_connections_per_client),
        "max_request_head_bytes": int(settings.max_request_head_bytes),
        "per_client": {},
        "events": events or RateLimitedLog(),
    })


def uvicorn_config(app: Any, settings: Any, log_level: str = "warning", **kw: Any) -> uvicorn.Config:
    """The ``uvicorn.Config`` for a gateway app under ``settings`` (a GatewaySettings); ``kw`` passes on."""
    install_log_filters()
    raise_fd_limit(int(settings.max_connections) + 256)  # the pool, model files and logs need descriptors too
    return uvicorn.Config(app, log_level=log_level, access_log=False, timeout_graceful_shutdown=5,
                          http=guarded_protocol(settings), timeout_keep_alive=settings.timeout_keep_alive_s,
                          limit_concurrency=settings.limit_concurrency, **kw)
