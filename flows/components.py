"""Config -> typed objects: the one place the Hydra config becomes a Pool, a backend, a
TrainConfig. Flows call these; library code never sees the config tree.

Errors name the bad key and the fix (``ConfigError``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from flows.config import ConfigError, RunConfig, lora_spec
from swarm.gateway import GatewaySettings
from swarm.policy import PolicyBackend, build_backend
from swarm.pool import Pool
from swarm.train import LoraSpec

__all__ = ["ConfigError", "model_path", "make_pool", "make_backend", "make_gateway_backend",
           "gateway_settings", "trainer_model_path", "tiny_spec", "model_dtype", "native_bf16_cpu"]

REPO = Path(__file__).resolve().parents[1]


def _get(cfg: dict[str, Any], key: str, where: str) -> Any:
    if key not in cfg:
        raise ConfigError(f"{where}.{key} is missing; set it in conf/{where}/*.yaml or with {where}.{key}=...")
    return cfg[key]


def model_path(model: dict[str, Any]) -> str:
    """The checkpoint to load: ``model.path`` (HF id or folder), ``model.gguf`` (a GGUF file or a packaged
    model's name, converted once: ``swarm/policy/gguf.py``), or the locally built tiny model."""
    path, gguf = model.get("path"), model.get("gguf")
    if path and gguf:
        raise ConfigError(f"model.path={path} and model.gguf={gguf} are both set; keep one")
    if path:
        return str(path)
    if gguf:
        from swarm.policy.gguf import ensure_gguf_model

        return str(ensure_gguf_model(str(gguf)))
    from swarm.policy.tiny import ensure_tiny_model

    spec = tiny_spec(model)
    warmup = model.get("warmup")
    if warmup in (None, "none"):
        return str(ensure_tiny_model(seed=int(model.get("seed", 0)), spec=spec))
    from swarm.policy.warmup import WARMUPS, get_warmup

    if warmup not in WARMUPS:
        raise ConfigError(f"model.warmup={warmup!r} is unknown; use {', '.join(WARMUPS)} or none")
    return str(ensure_tiny_model(seed=int(model.get("seed", 0)), spec=spec, warmup=get_warmup(warmup)))


def native_bf16_cpu() -> bool:
    """Whether this CPU computes bfloat16 natively (AVX512-BF16 or AMX flags in /proc/cpuinfo; Linux only).

    Elsewhere torch emulates bf16 matmuls on the CPU, slower than float32, so ``dtype: auto`` stays float32."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), [])
    return bool({"avx512_bf16", "amx_bf16"} & set(flags))


def model_dtype(model: dict[str, Any]) -> str:
    """``model.dtype`` with ``auto`` resolved: bfloat16 on CUDA or a CPU with native bf16, else float32."""
    dtype = str(model.get("dtype") or "float32")
    if dtype != "auto":
        return dtype
    if str(model.get("device", "cpu")).startswith("cuda") or native_bf16_cpu():
        return "bfloat16"
    return "float32"


def tiny_spec(model: dict[str, Any]) -> Any:
    """The tiny model's architecture: :class:`~swarm.policy.tiny.TinySpec` with ``model.tiny_spec`` overrides
    (e.g. ``{hidden_size: 256, intermediate_size: 1024}``: a 2x wider model, same tokenizer); None = the default."""
    from dataclasses import fields

    from swarm.policy.tiny import TinySpec

    overrides = dict(model.get("tiny_spec") or {})
    if not overrides:
        return None
    known = {f.name for f in fields(TinySpec)}
    bad = sorted(set(overrides) - known)
    if bad:
        raise ConfigError(f"model.tiny_spec.{bad[0]} is unknown; TinySpec fields: {sorted(known)}")
    if "vocab_size" in overrides:
        raise ConfigError("model.tiny_spec.vocab_size: the tiny tokenizer is shared by every tiny model; keep 1024")
    return TinySpec(**overrides)


def make_pool(pool: dict[str, Any]) -> Pool:
    url = os.environ.get("SWARM_POOL_URL") or _get(pool, "url", "pool")
    return Pool(str(url), block_size=int(pool.get("block_size", 64)))


def make_backend(model: dict[str, Any], policies: list[str], lora: LoraSpec | None) -> PolicyBackend:
    """The inference backend serving ``policies``; trainable policies get LoRA adapters matching ``lora``."""
    kind = _get(model, "backend", "model")
    if kind == "fleet":
        return _make_fleet(model, policies, lora)
    if kind == "hf":
        peft = None if lora is None else {"r": lora.rank, "alpha": lora.alpha, "dropout": lora.dropout,
                                          "target_modules": list(lora.target_modules)}
        return build_backend("hf", model_path=model_path(model), policies=list(policies), lora=peft,
                             device=model.get("device", "cpu"), dtype=model_dtype(model),
                             max_batch_size=int(model.get("max_batch_size", 16)),
                             torch_threads=model.get("torch_threads"),
                             chat_template=model.get("chat_template"), tool_parser=model.get("tool_parser"))
    kwargs = {k: v for k, v in model.items() if k not in ("backend", "name", "path", "gguf", "warmup", "seed", "tiny_spec")}
    if kind == "vllm" and lora is not None:
        kwargs.setdefault("lora", {"r": lora.rank, "alpha": lora.alpha, "target_modules": list(lora.target_modules)})
    return build_backend(kind, policies=list(policies), **kwargs)


def make_gateway_backend(cfg: RunConfig) -> PolicyBackend:
    """What the gateway serves: ``model`` for the trained ``policies``, and with ``frozen_policies`` a
    :class:`~swarm.policy.router.PolicyRouter` adding one backend per frozen policy (no LoRA, never loaded)."""
    trained = make_backend(cfg.model, cfg.policies, lora_spec(cfg.algo))
    if not cfg.frozen_policies:
        return trained
    from swarm.policy.router import PolicyRouter

    frozen = []
    for name, model in cfg.frozen_policies.items():
        try:
            frozen.append(make_backend(dict(model), [name], None))
        except ConfigError as exc:  # it names model.<key>: say which frozen policy's config that is
            raise ConfigError(f"frozen_policies.{name}: {exc}") from None
    return PolicyRouter([trained, *frozen], frozen=cfg.frozen_policies)


def trainer_model_path(model: dict[str, Any]) -> str:
    """Weights the trainer loads: the served checkpoint (hf), else ``model.path`` / ``tokenizer_path``."""
    if model.get("backend") == "hf":
        return model_path(model)
    path = model.get("path") or model.get("tokenizer_path")
    if not path:
        raise ConfigError("model.path is missing: the trainer needs the base weights of the served model "
                          "(an HF id or a local folder), e.g. model.path=Qwen/Qwen2.5-7B-Instruct")
    return str(path)


def _make_fleet(model: dict[str, Any], policies: list[str], lora: LoraSpec | None) -> PolicyBackend:
    """``model.backend: fleet``: each ``model.replicas`` entry is a model config of its own (see docs/scale_out.md)."""
    from swarm.policy.fleet import FleetBackend

    replicas = _get(model, "replicas", "model")
    if not replicas:
        raise ConfigError("model.replicas is empty; list at least one replica model config")
    named: dict[str, PolicyBackend] = {}
    caps: dict[str, float] = {}
    for i, rep in enumerate(replicas):
        rep = dict(rep)
        name = str(rep.pop("name", None) or f"r{i}")
        caps[name] = float(rep.pop("capacity", 1.0))
        if rep.get("backend") == "fleet":
            raise ConfigError(f"model.replicas[{i}].backend=fleet: a fleet cannot nest fleets")
        named[name] = make_backend(rep, policies, lora)
    kw = {k: model[k] for k in ("wait_s", "cooldown_s", "retries") if model.get(k) is not None}
    return FleetBackend(named, capacities=caps, **kw)


_GATEWAY_KEYS = ("base_url", "max_body_bytes", "max_whitebox_body_bytes", "max_tokens_cap", "max_n",
                 "default_max_tokens", "default_episode_timeout_s", "sweep_interval_s", "timeout_keep_alive_s",
                 "timeout_request_head_s", "timeout_request_body_s", "limit_concurrency", "max_connections",
                 "max_connections_per_client", "max_request_head_bytes", "allowed_hosts", "reward_authority")


def gateway_settings(gateway: dict[str, Any]) -> GatewaySettings:
    """GatewaySettings from the ``gateway`` config group and SWARM_* environment variables.

    ``allowed_hosts`` becomes a tuple of names and ``reward_authority`` a plain ``{task: source}`` dict,
    whether they arrive as plain containers or as omegaconf ones; a bad value is a :class:`ConfigError`
    naming ``gateway.<key>``.
    """
    kw = {k: gateway[k] for k in _GATEWAY_KEYS if k in gateway}
    hosts = kw.get("allowed_hosts")
    if hosts is not None:
        if isinstance(hosts, str) or not all(isinstance(h, str) and h for h in hosts):
            raise ConfigError(f"gateway.allowed_hosts={hosts!r}: give a list of host names, e.g. [myhost.lan]")
        kw["allowed_hosts"] = tuple(hosts)
    table = kw.get("reward_authority")
    if table is not None:
        if not isinstance(table, Mapping):
            raise ConfigError(f"gateway.reward_authority={table!r}: give a mapping of task to source, e.g. {{math: judge}}")
        kw["reward_authority"] = {str(t): str(v) for t, v in table.items()}
    try:
        return GatewaySettings.from_env(**kw)
    except ValueError as exc:
        raise ConfigError(f"gateway: {exc}".replace("GatewaySettings.", "gateway.")) from None
