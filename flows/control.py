"""The training flow's side of run control (:mod:`swarm.control`, docs/scale_out.md "Driving the server from a
client"): the knobs of a config, the check of a client's start overrides against the typed config
(:mod:`flows.config`), and applying queued knob changes between updates, each logged to MLflow at its policy
version (a ``control/<knob>`` metric, a ``control.<knob>`` tag, a line of ``control_events.jsonl``) and
printed. It neither serves routes nor runs the loop (:mod:`flows.run`).
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable
from typing import Any

from flows import console, tracking
from flows.config import ConfigError, RunConfig, check_task, validate
from swarm.control import Change
from swarm.errors import ValidationError

__all__ = ["knobs_of", "start_checker", "STARTABLE", "NEEDS_RESTART", "apply_changes", "log_event",
           "retrain_config"]

STARTABLE = ("task", "algo", "batching", "train", "feedback", "mlflow", "runner", "run_name")
# loaded or bound before the server waits: changing them needs a new process
NEEDS_RESTART = ("model", "pool", "gateway", "policies", "frozen_policies", "seed", "train.out_dir", "train.resume",
                 "train.device", "train.gradient_checkpointing", "train.wait_for_client", "algo.lora",
                 "algo.attention", "algo.kl_coef")


def knobs_of(cfg: RunConfig) -> dict[str, Any]:
    """The declared-safe knobs' values in ``cfg``."""
    return {"lr": cfg.algo.lr, "strategy": cfg.batching.strategy, "min_groups": cfg.batching.min_groups,
            "min_episodes": cfg.batching.min_episodes, "max_staleness": cfg.train.max_staleness,
            "eval_every": cfg.task.eval_every, "updates": cfg.train.updates}


def _set(tree: dict[str, Any], key: str, value: Any) -> None:
    *path, last = key.split(".")
    cur = tree
    for p in path:
        nxt = cur.get(p)
        if not isinstance(nxt, dict):
            nxt = cur[p] = {}
        cur = nxt
    cur[last] = value


def start_checker(cfg: RunConfig) -> Callable[[dict[str, Any]], tuple[RunConfig, dict[str, Any]]]:
    """``check(overrides)`` -> (the run's config with ``overrides`` applied and validated, its knobs); a
    ValidationError (400) names a key that needs a restart, is unknown, or has a bad value."""

    def check(overrides: dict[str, Any]) -> tuple[RunConfig, dict[str, Any]]:
        tree = cfg.raw()
        for key, value in overrides.items():
            restart = next((r for r in NEEDS_RESTART if key == r or key.startswith(r + ".")), None)
            if restart is not None:
                raise ValidationError(f"{key}: {restart} is fixed once the server waits (loaded or bound at start); "
                                      "restart python -m flows.train to change it", param=key, code="needs_restart")
            if key.split(".")[0] not in STARTABLE:
                raise ValidationError(f"{key}: not a start override; give keys under {', '.join(STARTABLE)}",
                                      param=key, code="unknown_key")
            _set(tree, key, value)
        try:
            new = validate(tree, overrides=[*cfg.overrides, *(f"{k}={v}" for k, v in overrides.items())])
            check_task(new.task, new.runner)
        except (ConfigError, ValueError) as exc:
            raise ValidationError(str(exc), code="invalid_value") from None
        return new, knobs_of(new)

    return check


def retrain_config(ledgers: dict[str, Any], cfg: RunConfig) -> None:
    """Give the trainers and ledgers the started config's algo and cadence (same LoRA; the optimizer's
    param groups take lr, betas and weight decay)."""
    for led in ledgers.values():
        tr = led.trainer
        tr.config = dataclasses.replace(cfg.algo.train_config(cfg.task.temperature, tr.config.pad_id),
                                        lora=tr.config.lora)
        for g in tr.optimizer.param_groups:
            g.update(lr=tr.config.lr, betas=tr.config.betas, weight_decay=tr.config.weight_decay)
        led.every, led.ttl_s = cfg.train.checkpoint_every, cfg.train.lease_ttl_s


def apply_changes(changes: list[Change], ledgers: dict[str, Any], settings: Any, workers: list[Any],
                  version: int, control: Any, lines: list[str]) -> Any:
    """Apply queued knob changes at policy ``version``; returns the update settings after them."""
    for ch in changes:
        if ch.knob == "lr":
            for led in ledgers.values():
                for g in led.trainer.optimizer.param_groups:
                    g["lr"] = ch.value
                led.trainer.config = dataclasses.replace(led.trainer.config, lr=ch.value)
        elif ch.knob in ("strategy", "min_groups", "min_episodes", "max_staleness"):
            settings = dataclasses.replace(settings, **{ch.knob: ch.value})
        elif ch.knob == "eval_every":
            for w in workers:  # the server's own workers read it at each new group
                w.eval_every = ch.value
        log_event(lines, control.mark_applied(ch, version))
    return settings


def log_event(lines: list[str], change: Change | None = None, *, event: str | None = None, version: int = 0,
              **fields: Any) -> None:
    """One control event: a line of the run's ``control_events.jsonl``, a metric and tag for a knob, the console."""
    if change is not None:
        version = change.version or 0
        row = {"event": "retune", "knob": change.knob, "value": change.value, "version": version,
               "requested_at": change.requested_at, "applied_at": change.applied_at}
        if isinstance(change.value, int | float) and not isinstance(change.value, bool):
            tracking.log_metrics({f"control/{change.knob}": float(change.value)}, step=version)
        tracking.mlflow.set_tag(f"control.{change.knob}", str(change.value))
        console.say(f"control: {change.knob} = {change.value} from policy version {version}")
    else:
        row = {"event": event, "version": version, "at": time.time(), **fields}
        console.say(f"control: {event} at policy version {version}")
    lines.append(json.dumps(row, default=str))
    tracking.log_text("\n".join(lines) + "\n", "control_events.jsonl")
