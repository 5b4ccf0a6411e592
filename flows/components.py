"""Config sections -> objects: the one place a validated section becomes a Pool, a backend, a gateway.

Flows call these (``flows.train``'s flow and ``flows.serve`` alike); library code never sees the
config. Each function takes its typed section (:mod:`flows.config`); errors name the key and the
fix (``ConfigError``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from flows.config import (
    ConfigError,
    EchoModel,
    FleetModel,
    GatewaySection,
    HFModel,
    Model,
    PoolSection,
    RunConfig,
    UpstreamModel,
    VLLMModel,
)
from swarm.policy import PolicyBackend
from swarm.pool import Pool
from swarm.stack import Stack, start_stack
from swarm.train import LoraSpec

__all__ = ["ConfigError", "model_path", "make_pool", "make_backend", "make_gateway_backend", "start_gateway",
           "trainer_model_path", "tiny_spec", "model_dtype", "native_bf16_cpu"]


def model_path(model: HFModel) -> str:
    """The checkpoint to load: ``model.path`` (HF id or folder), ``model.gguf`` (a GGUF file or a packaged
    model's name, converted once: ``swarm/policy/gguf.py``), or the locally built tiny model."""
    if model.path:
        return model.path
    if model.gguf:
        from swarm.policy.gguf import ensure_gguf_model

        return str(ensure_gguf_model(model.gguf))
    from swarm.policy.tiny import ensure_tiny_model

    if model.warmup in (None, "none"):
        return str(ensure_tiny_model(seed=model.seed, spec=tiny_spec(model)))
    from swarm.policy.warmup import get_warmup

    return str(ensure_tiny_model(seed=model.seed, spec=tiny_spec(model), warmup=get_warmup(model.warmup)))


def native_bf16_cpu() -> bool:
    """Whether this CPU computes bfloat16 natively (AVX512-BF16 or AMX flags in /proc/cpuinfo; Linux only).

    Elsewhere torch emulates bf16 matmuls on the CPU, slower than float32, so ``dtype: auto`` stays float32."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), [])
    return bool({"avx512_bf16", "amx_bf16"} & set(flags))


def model_dtype(model: HFModel | VLLMModel | FleetModel) -> str:
    """``model.dtype`` with ``auto`` resolved: bfloat16 on CUDA or a CPU with native bf16, else float32."""
    if model.dtype != "auto":
        return model.dtype
    return "bfloat16" if model.device.startswith("cuda") or native_bf16_cpu() else "float32"


def tiny_spec(model: HFModel) -> Any:
    """The tiny model's architecture: :class:`~swarm.policy.tiny.TinySpec` with ``model.tiny_spec`` overrides
    (e.g. ``{hidden_size: 256, intermediate_size: 1024}``: a 2x wider model, same tokenizer); None = the default."""
    from dataclasses import fields

    from swarm.policy.tiny import TinySpec

    if not model.tiny_spec:
        return None
    known = {f.name for f in fields(TinySpec)}
    bad = sorted(set(model.tiny_spec) - known)
    if bad:
        raise ConfigError(f"model.tiny_spec.{bad[0]} is unknown; TinySpec fields: {sorted(known)}")
    if "vocab_size" in model.tiny_spec:
        raise ConfigError("model.tiny_spec.vocab_size: the tiny tokenizer is shared by every tiny model; keep 1024")
    return TinySpec(**model.tiny_spec)


def make_pool(pool: PoolSection) -> Pool:
    """The data pool at ``pool.url`` ($SWARM_POOL_URL wins)."""
    return Pool(os.environ.get("SWARM_POOL_URL") or pool.url, block_size=pool.block_size)


def make_backend(model: Model, policies: list[str], lora: LoraSpec | None) -> PolicyBackend:
    """The inference backend serving ``policies``; trainable policies get LoRA adapters matching ``lora``."""
    policies = list(policies)
    if isinstance(model, HFModel):
        from swarm.policy.hf import HFBackend

        return HFBackend(model_path(model), policies, device=model.device, dtype=model_dtype(model),
                         max_batch_size=model.max_batch_size, batch_wait_ms=model.batch_wait_ms, lora=lora,
                         chat_template=model.chat_template, attn_implementation=model.attn_implementation,
                         torch_threads=model.torch_threads, tool_parser=model.tool_parser,
                         merge_lora=model.merge_lora, static_cache_len=model.static_cache_len,
                         compile_step=model.compile_step)
    if isinstance(model, VLLMModel):
        from swarm.policy.vllm import VLLMBackend

        return VLLMBackend(model.base_url, model.model, policies, tokenizer_path=model.tokenizer_path,
                           adapter_dir=model.adapter_dir, lora=lora, max_context=model.max_context,
                           chat_template=model.chat_template, timeout_s=model.timeout_s, tool_parser=model.tool_parser)
    if isinstance(model, UpstreamModel):
        from swarm.policy.upstream import UpstreamBackend

        return UpstreamBackend(model.base_url, model=model.model, policies=policies, timeout_s=model.timeout_s,
                               tokenizer_path=model.tokenizer_path, max_context=model.max_context,
                               logprobs=model.logprobs, extra_body=model.extra_body, api_key_env=model.api_key_env,
                               max_tokens=model.max_tokens, max_stop=model.max_stop, completions=model.completions,
                               tool_parser=model.tool_parser, max_top_logprobs=model.max_top_logprobs)
    if isinstance(model, EchoModel):
        from swarm.policy.echo import EchoBackend

        return EchoBackend(policies, reply=model.reply, max_context=model.max_context, delay_s=model.delay_s,
                           family=model.family)
    from swarm.policy.fleet import FleetBackend

    named = {rep.name or f"r{i}": make_backend(rep, policies, lora) for i, rep in enumerate(model.replicas)}
    return FleetBackend(named, capacities={rep.name or f"r{i}": rep.capacity for i, rep in enumerate(model.replicas)},
                        wait_s=model.wait_s, cooldown_s=model.cooldown_s, retries=model.retries)


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


def trainer_model_path(model: Model) -> str:
    """Weights the trainer loads: the served checkpoint (hf), else ``model.path`` / ``tokenizer_path``."""
    if isinstance(model, HFModel):
        return model_path(model)
    path = getattr(model, "path", None) or getattr(model, "tokenizer_path", None)
    if not path:
        raise ConfigError("model.path is missing: the trainer needs the base weights of the served model "
                          "(an HF id or a local folder), e.g. model.path=Qwen/Qwen2.5-7B-Instruct")
    return str(path)


def start_gateway(pool: Pool, backend: PolicyBackend, gateway: GatewaySection, control: Any = None) -> Stack:
    """Serve ``pool`` + ``backend`` on ``gateway.host:port`` at ``gateway.log_level`` (flows.train and flows.serve);
    with ``gateway.follow_versions_s`` the backend also loads the pool's newer policy versions (a second gateway);
    ``control`` (flows.train's run control) serves ``/v1/control``."""
    stack = start_stack(pool, backend, gateway.settings(), host=gateway.host, port=gateway.port,
                        log_level=gateway.log_level, control=control)
    if gateway.follow_versions_s > 0:
        from swarm.policy.fleet import VersionFollower

        stack.extra["follower"] = VersionFollower(pool, backend, interval_s=gateway.follow_versions_s).start()
    return stack
