"""GatewaySettings: the gateway's typed configuration (built by flows/serve.py or by tests).

Plain dataclass, no config framework: the entry point composes Hydra config and environment
variables into it. It does not read files; :meth:`GatewaySettings.from_env` only fills the three
secrets from ``SWARM_GATEWAY_SECRET``, ``SWARM_CLIENT_TOKEN`` and ``SWARM_ADMIN_TOKEN``.
"""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass, field, replace
from typing import Any

__all__ = ["GatewaySettings"]

MiB = 1024 * 1024


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
    max_body_bytes: int = 8 * MiB  # OpenAI-compatible and service routes
    max_whitebox_body_bytes: int = 256 * MiB  # POST /v1/steps: any length is accepted there
    max_tokens_cap: int = 32768  # an absurd max_tokens is refused even if the context allows it
    max_n: int = 16
    default_max_tokens: int | None = None  # None: whatever fits in the context (capped)
    default_episode_timeout_s: float = 600.0
    max_episode_timeout_s: float = 7 * 24 * 3600.0
    sweep_interval_s: float = 5.0  # how often open episodes past their timeout become abandoned
    tool_call_markers: tuple[str, ...] = ("<tool_call>",)  # streamed text is held back from here on

    def __post_init__(self) -> None:
        if isinstance(self.secret, str):
            object.__setattr__(self, "secret", self.secret.encode("utf-8"))
        if len(self.secret) < 16:
            raise ValueError("GatewaySettings.secret must be at least 16 bytes; use e.g. `openssl rand -hex 32`")
        for name in ("max_body_bytes", "max_whitebox_body_bytes", "max_tokens_cap", "max_n"):
            if getattr(self, name) < 1:
                raise ValueError(f"GatewaySettings.{name} must be >= 1, got {getattr(self, name)}")
        if self.default_episode_timeout_s <= 0 or self.sweep_interval_s <= 0:
            raise ValueError("GatewaySettings timeouts must be > 0")
        if self.base_url is not None:
            object.__setattr__(self, "base_url", self.base_url.rstrip("/"))

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

    def with_(self, **changes: Any) -> GatewaySettings:
        return replace(self, **changes)
