"""The swarm client SDK: begin an episode on a gateway, hand its base_url + api key to any
OpenAI-compatible agent code, then end it with a reward.

    client = SwarmClient("http://127.0.0.1:8420")
    with client.episode(task="echo", group_id="echo-7") as ep:
        reply = ep.openai().chat.completions.create(model="default", messages=[...])
        ep.end(reward=1.0, correct=1)

An exception inside the block aborts the episode and re-raises. A multi-agent game opens its seats'
episodes through one :class:`EpisodeSet`, which heartbeats them together and aborts the open ones
if the game fails. The run control methods
(``control_status``, ``start_run``, ``pause``, ``resume``, ``retune``, ``stop_run``) drive the training run
behind the gateway with the admin token (``admin_token``, default ``$SWARM_ADMIN_TOKEN``). Connection errors are retried
with exponential backoff; HTTP errors are raised at once as :class:`ClientError` with the
gateway's message. This module does not run tasks (see :mod:`swarm.client.worker`).
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from collections.abc import ItemsView, Iterator
from types import TracebackType
from typing import Any

import httpx

from swarm.errors import SwarmError

__all__ = ["SwarmClient", "EpisodeHandle", "EpisodeSet", "ClientError"]


class ClientError(SwarmError, RuntimeError):
    """The gateway refused a call (4xx/5xx; ``status_code``) or could not be reached after all retries (``None``)."""

    def __init__(self, message: str, status_code: int | None = None, episode_id: str | None = None) -> None:
        super().__init__(message, episode_id=episode_id)
        self.status_code = status_code  # type: ignore[assignment]  # None: no answer at all
        self.episode_id = episode_id


class SwarmClient:
    """Talks to one gateway; ``token`` is the client token when the gateway requires one.

    ``metadata`` goes into every episode this client begins (an episode's own metadata wins on a
    shared key): the worker sets ``{"code_version": ...}`` so each episode names the task code that ran it.
    """

    def __init__(
        self,
        url: str,
        token: str | None = None,
        timeout: float = 60.0,
        retries: int = 5,
        backoff_s: float = 0.25,
        transport: httpx.BaseTransport | None = None,
        metadata: dict[str, Any] | None = None,
        admin_token: str | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self.token = token if token is not None else os.environ.get("SWARM_CLIENT_TOKEN")
        self.admin_token = admin_token if admin_token is not None else os.environ.get("SWARM_ADMIN_TOKEN")
        self.retries = retries
        self.backoff_s = backoff_s
        self.metadata = dict(metadata or {})
        self._http = httpx.Client(base_url=self.url, timeout=timeout, transport=transport)
        self.last_api_key: str | None = None  # of the last episode begun: a credential for /v1/sync

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> SwarmClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def request(self, method: str, path: str, *, key: str | None = None, json: Any = None,
                episode_id: str | None = None) -> Any:
        """One JSON call with retries on connection errors; raises :class:`ClientError` otherwise."""
        headers = {}
        bearer = key or self.token
        if bearer:
            headers["Authorization"] = f"Bearer {bearer}"
        if method.upper() == "POST":  # the same on every retry: a repeated call is answered, not recorded twice
            headers["Idempotency-Key"] = f"swarm-{uuid.uuid4().hex}"
        delay = self.backoff_s
        for attempt in range(self.retries + 1):
            try:
                resp = self._http.request(method, path, json=json, headers=headers)
            except (httpx.ConnectError, httpx.ConnectTimeout, httpx.RemoteProtocolError, httpx.ReadError) as exc:
                if attempt == self.retries:
                    raise ClientError(f"cannot reach gateway at {self.url}: {exc}", episode_id=episode_id) from exc
                time.sleep(delay)
                delay = min(delay * 2, 5.0)
                continue
            if resp.status_code >= 400:
                raise ClientError(_error_message(resp), status_code=resp.status_code, episode_id=episode_id)
            return resp.json() if resp.content else None
        raise AssertionError("unreachable")

    def health(self) -> dict[str, Any]:
        return self.request("GET", "/health")

    def agree(self, client_id: str, key: str | None = None) -> dict[str, Any]:
        """Ask for an update now (batching strategies C4 / C5); returns active and agreed clients.

        A gateway with tokens needs a credential here: the client token, else ``key`` or the api key
        of the last episode this client began.
        """
        return self.request("POST", "/v1/sync/agree", json={"client_id": client_id},
                            key=key or (None if self.token else self.last_api_key))

    # -- run control (/v1/control, docs/scale_out.md "Driving the server from a client") --
    def control_status(self) -> dict[str, Any]:
        """The run's state, holder, policy version, updates done / total and knobs."""
        return self.request("GET", "/v1/control", key=self.admin_token)

    def start_run(self, overrides: dict[str, Any] | None = None, holder: str | None = None,
                  **knobs: Any) -> dict[str, Any]:
        """Start a waiting run with config ``overrides`` (dotted keys) and knobs by short name (``lr=1e-3``)."""
        body = {"overrides": {**(overrides or {}), **knobs},
                "holder": holder or f"{socket.gethostname()}:{os.getpid()}"}
        return self.request("POST", "/v1/control/start", json=body, key=self.admin_token)

    def pause(self) -> dict[str, Any]:
        """Hold the run before its next update."""
        return self.request("POST", "/v1/control/pause", key=self.admin_token)

    def resume(self) -> dict[str, Any]:
        """Let a paused run go on."""
        return self.request("POST", "/v1/control/resume", key=self.admin_token)

    def retune(self, knobs: dict[str, Any] | None = None, **short: Any) -> dict[str, Any]:
        """Change declared-safe knobs between updates (``lr``, ``strategy``, ``min_groups``, ...)."""
        return self.request("POST", "/v1/control/retune", json={**(knobs or {}), **short}, key=self.admin_token)

    def stop_run(self) -> dict[str, Any]:
        """End the run cleanly (the current update, then the checkpoint)."""
        return self.request("POST", "/v1/control/stop", key=self.admin_token)

    def begin(self, task: str, group_id: str | None = None, type: str = "train", client_id: str | None = None,
              timeout_s: float | None = None, metadata: dict[str, Any] | None = None) -> EpisodeHandle:
        """Begin an episode without a ``with`` block; call ``end`` or ``abort`` yourself."""
        body = {"task": task, "group_id": group_id, "type": type, "client_id": client_id,
                "timeout_s": timeout_s, "metadata": {**self.metadata, **(metadata or {})}}
        data = self.request("POST", "/v1/episodes", json={k: v for k, v in body.items() if v is not None})
        self.last_api_key = data["api_key"]
        return EpisodeHandle(self, data["episode_id"], data["base_url"], data["api_key"])

    def episode(self, task: str, group_id: str | None = None, type: str = "train", client_id: str | None = None,
                timeout_s: float | None = None, metadata: dict[str, Any] | None = None) -> EpisodeHandle:
        """An episode to use as a context manager (see the module docstring)."""
        return self.begin(task, group_id=group_id, type=type, client_id=client_id, timeout_s=timeout_s,
                          metadata=metadata)


def _idempotent(client: Any) -> Any:
    """``client`` sending an ``Idempotency-Key`` header on each POST, the same on its retries.

    The OpenAI SDK makes one key per request and reuses it when it retries (a lost answer, a 5xx);
    it sends it only when its ``_idempotency_header`` names the header, which ``OpenAI`` leaves unset.
    The gateway answers a repeated key from the stored step instead of recording the call twice.
    """
    if hasattr(client, "_idempotency_header"):
        client._idempotency_header = "Idempotency-Key"
    return client


class EpisodeHandle:
    """One open episode: its OpenAI base_url and api key, plus heartbeat / end / abort."""

    def __init__(self, client: SwarmClient, episode_id: str, base_url: str, api_key: str) -> None:
        self.client = client
        self.episode_id = episode_id
        self.base_url = base_url
        self.api_key = api_key
        self.ended = False

    def openai(self, **kwargs: Any) -> Any:
        """A configured ``openai.OpenAI`` for this episode; it sends an ``Idempotency-Key`` per call."""
        import openai

        return _idempotent(openai.OpenAI(base_url=self.base_url, api_key=self.api_key, **kwargs))

    def async_openai(self, **kwargs: Any) -> Any:
        """A configured ``openai.AsyncOpenAI`` for this episode; it sends an ``Idempotency-Key`` per call."""
        import openai

        return _idempotent(openai.AsyncOpenAI(base_url=self.base_url, api_key=self.api_key, **kwargs))

    def _call(self, action: str, body: dict[str, Any] | None = None) -> Any:
        return self.client.request("POST", f"/v1/episodes/{self.episode_id}/{action}", key=self.api_key,
                                   json=body or {}, episode_id=self.episode_id)

    def heartbeat(self) -> None:
        self._call("heartbeat")

    def end(self, reward: float | None = None, step_rewards: dict[str, float] | None = None,
            status: str = "finished", **metrics: Any) -> None:
        """Finish the episode; extra keyword arguments are stored as metrics in its metadata."""
        body: dict[str, Any] = {"status": status, "metadata": {"metrics": metrics} if metrics else {}}
        if reward is not None:
            body["reward"] = reward
        if step_rewards:
            body["step_rewards"] = step_rewards
        self._call("end", body)
        self.ended = True

    def abort(self) -> None:
        self._call("abort")
        self.ended = True

    def __enter__(self) -> EpisodeHandle:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self.ended:
            return
        if exc_type is not None:
            try:
                self.abort()
            except ClientError:
                pass  # the original exception matters more; the gateway abandons it on timeout
            return
        self.end()


class EpisodeSet:
    """The episodes one multi-agent game opens (one per LLM seat, keyed by seat), kept alive and ended together.

        with EpisodeSet(client) as seats:
            ep = seats.begin(player, task="werewolves", group_id=group_id, type="train")
            ...  # the game loop calls seats.heartbeat() now and then
            for player, ep in seats.items():
                ep.end(reward=...)

    Leaving the block by an exception aborts every episode not yet ended and re-raises; an abort that
    fails is passed over (the game's error matters more; the gateway abandons the episode on its timeout).
    """

    def __init__(self, client: SwarmClient, heartbeat_s: float = 10.0) -> None:
        self.client = client
        self.heartbeat_s = heartbeat_s
        self.episodes: dict[Any, EpisodeHandle] = {}
        self._last_beat = time.monotonic()

    def begin(self, seat: Any, task: str, **kwargs: Any) -> EpisodeHandle:
        """Begin ``seat``'s episode (``kwargs`` as :meth:`SwarmClient.begin`)."""
        ep = self.episodes[seat] = self.client.begin(task=task, **kwargs)
        return ep

    def heartbeat(self) -> None:
        """Heartbeat the open episodes when ``heartbeat_s`` has passed since the last time (a long game must not
        time its episodes out); cheap to call on every turn."""
        if time.monotonic() - self._last_beat > self.heartbeat_s:
            for ep in self.episodes.values():
                if not ep.ended:
                    ep.heartbeat()
            self._last_beat = time.monotonic()

    def abort_open(self) -> None:
        """Abort every episode not yet ended; a failing abort is passed over (see the class docstring)."""
        for ep in self.episodes.values():
            if not ep.ended:
                try:
                    ep.abort()
                except (ClientError, httpx.HTTPError):
                    pass

    def items(self) -> ItemsView[Any, EpisodeHandle]:
        return self.episodes.items()

    def __iter__(self) -> Iterator[Any]:
        return iter(self.episodes)

    def __getitem__(self, seat: Any) -> EpisodeHandle:
        return self.episodes[seat]

    def __contains__(self, seat: object) -> bool:
        return seat in self.episodes

    def __len__(self) -> int:
        return len(self.episodes)

    def __enter__(self) -> EpisodeSet:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if exc_type is not None:
            self.abort_open()


def _error_message(resp: httpx.Response) -> str:
    try:
        err = resp.json().get("error", {})
        return f"{resp.status_code} {err.get('type', 'error')}: {err.get('message', resp.text)}"
    except (ValueError, AttributeError):
        return f"{resp.status_code}: {resp.text[:500]}"
