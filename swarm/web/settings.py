"""GatewaySettings: the gateway's typed configuration (built by flows/serve.py or by tests).

Plain dataclass, no config framework: the entry point composes Hydra config and environment
variables into it. It does not read files; :meth:`GatewaySettings.from_env` only fills the three
secrets from ``SWARM_GATEWAY_SECRET``, ``SWARM_CLIENT_TOKEN`` and ``SWARM_ADMIN_TOKEN``.

Safe by default: :meth:`GatewaySettings.check_bind` refuses to serve on any address other than
loopback unless both tokens are set, and :meth:`GatewaySettings.access_summary` says which routes
are open (the serving code logs it at start-up).
"""

from __future__ import annotations

import ipaddress
import os
import secrets
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from pydantic import Field

__all__ = ["GatewaySettings", "is_loopback"]

MiB = 1024 * 1024
_Pos = Annotated[int, Field(ge=1)]  # checked where a config section is derived from these fields (flows.config)
_Secs = Annotated[float, Field(gt=0)]


@dataclass(frozen=True)
class GatewaySettings:
    """How one gateway process behaves.

    ``secret`` signs episode api keys; it is random per process unless given, so keys die with
    the process. Give several gateways the same secret (and the same pool) and a key issued by
    one verifies on all. ``client_token`` guards episode creation and service ingestion,
    ``admin_token`` guards leases and labels; each is off (open on loopback) when ``None``.
    """

    base_url: str | None = None  # public URL clients should use; derived from the request if None
    secret: bytes = field(default_factory=lambda: secrets.token_bytes(32), repr=False)
    client_token: str | None = field(default=None, repr=False)
    admin_token: str | None = field(default=None, repr=False)
    max_body_bytes: _Pos = 8 * MiB  # OpenAI-compatible and service routes
    # POST /v1/steps: peak memory grows by ~14-18x the body (tests/gateway/test_memory.py bounds it at 24x,
    # benchmarks/reliability_bench.py prints it), so a 64 MiB body costs ~1.2 GB at most
    max_whitebox_body_bytes: _Pos = 64 * MiB
    max_tokens_cap: _Pos = 32768  # an absurd max_tokens is refused even if the context allows it
    max_n: _Pos = 16
    default_max_tokens: _Pos | None = None  # None: whatever fits in the context (capped)
    default_episode_timeout_s: _Secs = 600.0
    max_episode_timeout_s: _Secs = 7 * 24 * 3600.0
    sweep_interval_s: _Secs = 5.0  # how often open episodes past their timeout become abandoned
    tool_call_markers: tuple[str, ...] = ("<tool_call>",)  # streamed text is held back from here on
    # connections (swarm/gateway/connections.py), sized for hundreds of agents on one gateway
    timeout_keep_alive_s: _Secs = 20.0  # an idle connection (new, or between requests) is closed after this
    timeout_request_head_s: _Secs = 10.0  # from a request's first byte to its complete head (slowloris)
    timeout_request_body_s: _Secs = 120.0  # from the head to the complete body (a body sent at 1 byte/s)
    limit_concurrency: _Pos = 1024  # open connections or running requests above which a request gets 503
    max_connections: _Pos = 2048  # connections above which a new one gets 503 and is closed unread
    # one client address holding this many: its next connection gets 503, closed unread (below limit_concurrency,
    # so one host cannot starve the others)
    max_connections_per_client: _Pos = 512
    max_request_head_bytes: _Pos = 32 * 1024  # request line + headers; larger is a 400
    # without tokens only loopback Host names are served (DNS rebinding; swarm/gateway/hosts.py), plus these
    allowed_hosts: tuple[Annotated[str, Field(min_length=1)], ...] = ()
    # task -> the lowest reward source applied ("agent" | "judge" | "admin"; swarm/pool/rewards.py); default agent:
    # the agent may report its reward, and a judge's (client token) or admin's supersedes it
    reward_authority: dict[str, Literal["agent", "judge", "admin"]] | None = None  # None: {} (agent everywhere)

    def __post_init__(self) -> None:
        if isinstance(self.secret, str):
            object.__setattr__(self, "secret", self.secret.encode("utf-8"))
        if len(self.secret) < 16:
            raise ValueError("GatewaySettings.secret must be at least 16 bytes; use e.g. `openssl rand -hex 32`")
        for name in ("max_body_bytes", "max_whitebox_body_bytes", "max_tokens_cap", "max_n", "limit_concurrency",
                     "max_connections", "max_connections_per_client", "max_request_head_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"GatewaySettings.{name} must be >= 1, got {getattr(self, name)}")
        for name in ("default_episode_timeout_s", "sweep_interval_s", "timeout_keep_alive_s", "timeout_request_head_s",
                     "timeout_request_body_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"GatewaySettings.{name} must be > 0, got {getattr(self, name)}")
        if self.base_url is not None:
            object.__setattr__(self, "base_url", self.base_url.rstrip("/"))
        object.__setattr__(self, "allowed_hosts", tuple(self.allowed_hosts))
        object.__setattr__(self, "reward_authority", dict(self.reward_authority or {}))
        bad = {t: v for t, v in self.reward_authority.items() if v not in ("agent", "judge", "admin")}
        if bad:
            raise ValueError(f"GatewaySettings.reward_authority: {bad} must map tasks to 'agent', 'judge' or 'admin'")

    @property
    def open(self) -> bool:
        """No token configured: the gateway trusts whoever reaches it (loopback only)."""
        return self.admin_token is None and self.client_token is None

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None, **overrides: Any) -> GatewaySettings:
        """Settings with secrets from the environment (empty variables count as unset)."""
        env = dict(os.environ if env is None else env)
        kw: dict[str, Any] = {}
        if env.get("SWARM_GATEWAY_SECRET"):
            kw["secret"] = env["SWARM_GATEWAY_SECRET"]
        if env.get("SWARM_CLIENT_TOKEN"):
            kw["client_token"] = env["SWARM_CLIENT_TOKEN"]
        if env.get("SWARM_ADMIN_TOKEN"):
            kw["admin_token"] = env["SWARM_ADMIN_TOKEN"]
        kw.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**kw)

    def check_bind(self, host: str) -> None:
        """Refuse (ValueError) to serve on a non-loopback ``host`` without both tokens."""
        if is_loopback(host):
            return
        missing = [name for name, v in (("SWARM_ADMIN_TOKEN", self.admin_token), ("SWARM_CLIENT_TOKEN",
                                                                                  self.client_token)) if not v]
        if missing:
            raise ValueError(f"refusing to serve on {host}: off loopback the gateway needs {' and '.join(missing)} "
                             "(leases, labels, pool reads and episode creation would be open to anyone who reaches "
                             "the port); set them, e.g. `export SWARM_ADMIN_TOKEN=$(openssl rand -hex 32)`, "
                             "or bind 127.0.0.1")

    def access_summary(self) -> str:
        """Which route groups are open and which need which token, in one line."""
        open_, guarded = [], []
        (guarded if self.client_token else open_).append("episode creation")
        (guarded if self.admin_token or self.client_token else open_).append("pool reads + dashboard data")
        (guarded if self.admin_token else open_).append("leases/acks/labels/exports")
        parts = ["calls, steps, events and feedback need an episode key or a service token"]
        if guarded:
            parts.append("token required: " + ", ".join(guarded))
        if open_:
            parts.append("OPEN to anyone who reaches the port: " + ", ".join(open_))
        return "; ".join(parts)


def is_loopback(host: str) -> bool:
    """Whether ``host`` is a loopback name or address (127.0.0.0/8, ::1, localhost)."""
    if host.strip("[]").lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name: it may resolve anywhere
