"""Config sections -> objects: the one place a validated section becomes a Pool, a backend, a gateway.

Flows call these (``flows.train``'s flow and ``flows.serve`` alike); library code never sees the
config. A backend is built by its own section (``model.build``: swarm/policy/settings.py's registry),
so nothing here names a backend kind. Errors name the key and the fix (``ConfigError``).
"""

from __future__ import annotations

import os
from typing import Any

from flows.config import ConfigError, GatewaySection, Model, PoolSection, RunConfig
from swarm.policy import PolicyBackend
from swarm.policy.settings import BackendSection, WeightsSection, native_bf16_cpu
from swarm.pool import Pool, open_pool
from swarm.stack import Stack, start_stack
from swarm.train import LoraSpec

__all__ = ["ConfigError", "make_pool", "make_backend", "make_gateway_backend", "start_gateway", "trainer_model_path",
           "model_dtype", "native_bf16_cpu"]


def make_pool(pool: PoolSection) -> Pool:
    """The data pool at ``pool.url`` ($SWARM_POOL_URL wins) on its engine (swarm/pool/engines), with its settings."""
    return open_pool(**pool.open_args(os.environ.get("SWARM_POOL_URL")))


def make_backend(model: Model, policies: list[str], lora: LoraSpec | None) -> PolicyBackend:
    """The inference backend serving ``policies``; trainable policies get LoRA adapters matching ``lora``."""
    return model.build(list(policies), lora)


def make_gateway_backend(cfg: RunConfig) -> PolicyBackend:
    """What the gateway serves: ``model`` for the trained ``policies``, and with ``frozen_policies`` a
    :class:`~swarm.policy.router.PolicyRouter` adding one backend per frozen policy (no LoRA, never loaded)."""
    trained = make_backend(cfg.model, cfg.policies, cfg.algo.lora)
    if not cfg.frozen_policies:
        return trained
    from swarm.policy.router import PolicyRouter

    frozen = []
    for name, model in cfg.frozen_policies.items():
        try:
            frozen.append(make_backend(model, [name], None))
        except ConfigError as exc:  # it names model.<key>: say which frozen policy's config that is
            raise ConfigError(f"frozen_policies.{name}: {exc}") from None
    return PolicyRouter([trained, *frozen], frozen=list(cfg.frozen_policies))


def trainer_model_path(model: BackendSection) -> str:
    """Weights the trainer loads: the served checkpoint (hf), else ``model.path`` / ``tokenizer_path``."""
    return model.trainer_weights()


def model_dtype(model: BackendSection) -> str:
    """``model.dtype`` with ``auto`` resolved (bfloat16 on CUDA or a CPU with native bf16, else float32)."""
    return model.resolved_dtype() if isinstance(model, WeightsSection) else "float32"


def start_gateway(pool: Pool, backend: PolicyBackend, gateway: GatewaySection, control: Any = None,
                  reward_authority: dict[str, str] | None = None) -> Stack:
    """Serve ``pool`` + ``backend`` on ``gateway.host:port`` at ``gateway.log_level`` (flows.train and flows.serve);
    with ``gateway.follow_versions_s`` the backend also loads the pool's newer policy versions (a second gateway);
    ``control`` (flows.train's run control) serves ``/v1/control``; ``reward_authority``: the task's reward kind's
    (``task.reward.authority``), below what ``gateway.reward_authority`` sets."""
    stack = start_stack(pool, backend, gateway.settings(reward_authority), host=gateway.host, port=gateway.port,
                        log_level=gateway.log_level, control=control, freeze_heap=True)
    if gateway.follow_versions_s > 0:
        from swarm.policy.fleet import VersionFollower

        stack.extra["follower"] = VersionFollower(pool, backend, interval_s=gateway.follow_versions_s).start()
    return stack
