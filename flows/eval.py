"""``python -m flows.eval eval.version=N [+task=NAME] [key=value ...]``: evaluate a pinned version while training goes on.

Composes ``conf/eval.yaml`` (groups ``model``, ``pool``, ``gateway``, ``+task=<name>``), validates it into
:class:`flows.config.EvalConfig` (a bad key is one ``config error:`` line, exit 2, before torch is
imported), then in this process: the pool at ``pool.url`` (the training run's, SQLite on this machine
or PostgreSQL from anywhere), a backend holding ``model``'s base plus the version's adapter (the
pool's ``adapter_path``, or ``eval.checkpoint``) and reporting that version, a gateway on a free port,
and the task's client worker running ``eval.groups`` groups on seeds ``eval.seed ...`` as *eval*
episodes (never leased by a trainer), tagged ``eval_run`` / ``eval_of: {policy, version}``. When they
have ended: one :class:`~swarm.pool.EvalResult` (``source="pinned"``) per task in the pool and one
MLflow run ``eval <policy> v<N>`` (``eval/reward``, ``eval/<metric>`` at step N). Ctrl-C / SIGTERM stop
the episodes, the gateway and the backend and exit 130 / 143 without recording a result.

It neither trains nor follows newer versions; the trainer's own ``task.eval_every`` groups stay the
training run's business.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import statistics
import sys
import threading
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import hydra
from omegaconf import DictConfig, OmegaConf

from flows.cli import CONF, check_overrides, fail
from flows.config import (
    ConfigError,
    EvalConfig,
    EvalSection,
    Model,
    check_pool_url,
    check_task,
    validate,
)
from swarm.errors import SwarmError

if TYPE_CHECKING:  # swarm's pool and backends are imported where used: the CLI's config check stays light
    from swarm.policy import PolicyBackend
    from swarm.pool import EvalResult, Lookup, Versions
    from swarm.records import Episode

__all__ = ["main", "cli_config", "EvalFailed", "Target", "resolve_target", "summarize", "run_eval", "Outcome",
           "summary_line"]


class EvalFailed(SwarmError, RuntimeError):
    """The evaluation could not produce a result (no episode finished); the message says which."""


@dataclass(frozen=True)
class Target:
    """The weights to evaluate: ``policy`` at ``version``; ``weights`` an adapter (or full model) folder, None: base."""

    policy: str
    version: int
    weights: Path | None
    training_run_id: str | None = None  # the MLflow run that published it, when its record says so
    source: str = ""  # "version 3" / "checkpoint DIR", for messages


@dataclass
class Outcome:
    """What one evaluation recorded (``results``: one per task) and how its episodes went."""

    target: Target
    eval_run: str
    results: list[EvalResult] = field(default_factory=list)
    failed: int = 0
    mlflow_run_id: str | None = None


# -- which weights ------------------------------------------------------------------------------

def _version_target(pool: Versions, ev: EvalSection) -> Target:
    policy, v = ev.policy, int(ev.version or 0)
    records = pool.policy_versions(policy)
    if v == 0:  # the base weights every run starts from: nothing to load
        return Target(policy, 0, None, source="version 0 (the base weights)")
    rec = next((r for r in records if r.version == v), None)
    if rec is None:
        have = f"{records[0].version}..{records[-1].version}" if records else "none"
        raise ConfigError(f"eval.version={v}: policy {policy!r} has no published version {v} in this pool "
                          f"(published: {have}); is pool.url the training run's?")
    if rec.adapter_path is None:
        kept = [r.version for r in records if r.adapter_path]
        raise ConfigError(f"eval.version={v}: version {v} of {policy!r} kept no adapter. Checkpoints keep adapters: "
                          f"train.checkpoint_every=k keeps every k-th version's (1: every version's); versions of "
                          f"{policy!r} with an adapter: {kept or 'none'}")
    path = Path(rec.adapter_path)
    if not path.is_dir():
        raise ConfigError(f"eval.version={v}: its adapter {path} is not on this machine; copy that folder here and "
                          "pass eval.checkpoint=<the copy>")
    return Target(policy, v, path, rec.metadata.get("mlflow_run_id"), f"version {v}")


def _checkpoint_target(ev: EvalSection) -> Target:
    """An adapter / full-model folder written by the trainer (its ``swarm_version.json`` names policy and
    version), or a trainer checkpoint (``ckpt-N`` or its root with ``LATEST``): the adapter that commit wrote."""
    import json

    path = Path(str(ev.checkpoint)).expanduser()
    key = f"eval.checkpoint={ev.checkpoint}"
    if not path.is_dir():
        raise ConfigError(f"{key}: no such folder")
    if (path / "LATEST").is_file():
        path = path / (path / "LATEST").read_text().strip()
    if (path / "state.pt").is_file():  # checkpoints/<policy>/ckpt-N -> adapters/<policy>/v<version>
        import torch

        state = torch.load(path / "state.pt", map_location="cpu", weights_only=False)
        adapter = path.parents[2] / "adapters" / state["policy"] / f"v{int(state['version']):06d}"
        if not adapter.is_dir():
            raise ConfigError(f"{key}: checkpoint of version {state['version']}, but its adapter {adapter} is missing")
        path = adapter
    meta = path / "swarm_version.json"
    if not meta.is_file() or not ((path / "adapter_model.safetensors").is_file() or (path / "config.json").is_file()):
        raise ConfigError(f"{key}: not an adapter folder (adapters/<policy>/v<N>) or trainer checkpoint "
                          "(checkpoints/<policy>[/ckpt-N]) written by flows.train")
    info = json.loads(meta.read_text())
    policy = str(info.get("policy") or ev.policy)
    if policy != ev.policy:
        raise ConfigError(f"{key}: it holds policy {policy!r}; set eval.policy={policy}")
    return Target(policy, int(info["version"]), path, source=f"checkpoint {path}")


def resolve_target(pool: Versions, ev: EvalSection) -> Target:
    """The weights ``eval`` names: a published version (its adapter in the pool's record) or a checkpoint folder;
    ConfigError (naming the key) when they cannot be evaluated here."""
    return _checkpoint_target(ev) if ev.checkpoint is not None else _version_target(pool, ev)


def _backend(model: Model, target: Target) -> PolicyBackend:
    """``model``'s base with the target's weights, serving ``target.policy`` at ``target.version``."""
    from flows.components import make_backend
    from swarm.policy.fleet import load_adapter_dir, load_adapter_spec

    w = target.weights
    if w is not None and not (w / "adapter_config.json").is_file():  # a full fine-tune: the base's weights replaced
        from safetensors.torch import load_file

        if model.backend != "hf":
            raise ConfigError(f"{target.source}: a full fine-tune's weights are loaded by model.backend=hf")
        backend = make_backend(model, [target.policy], None)
        state = {k: v for f in sorted(w.glob("*.safetensors")) for k, v in load_file(str(f)).items()}
    else:
        spec = None if w is None else load_adapter_spec(w)
        backend = make_backend(model, [target.policy], spec)
        state = None if w is None else load_adapter_dir(w)
    if target.version > 0:
        try:
            backend.load_weights(target.policy, state, target.version)
        except (RuntimeError, SwarmError) as exc:  # torch's size mismatch, unknown keys: another base model
            if callable(getattr(backend, "close", None)):
                backend.close()
            why = " ".join(line.strip() for line in str(exc).strip().splitlines()[:2])
            raise ConfigError(f"model={model.name or model.backend}: the weights of {target.source} do not fit it "
                              f"({why[:400]}); pass the training run's model=") from None
    return backend


# -- the result ---------------------------------------------------------------------------------

def _mean(xs: list[float]) -> float | None:
    """The mean, exactly rounded (``fsum``): the same for the same episodes, whatever order they ended in."""
    return statistics.fmean(xs) if xs else None


def summarize(episodes: list[Episode], target: Target, eval_run: str,
              extra: dict[str, object] | None = None) -> list[EvalResult]:
    """One pinned :class:`~swarm.pool.EvalResult` per task of the finished ``episodes``: their count, mean
    reward and the means of their numeric metrics (``win``, ...); ``extra`` goes into each one's metadata."""
    from swarm.pool.evals import EvalResult

    by_task: dict[str, list[Episode]] = {}
    for ep in episodes:
        if ep.status == "finished" and ep.reward is not None:
            by_task.setdefault(ep.task, []).append(ep)
    out = []
    for task, eps in sorted(by_task.items()):
        values: dict[str, list[float]] = {}
        for ep in eps:
            for k, v in (ep.metadata.get("metrics") or {}).items():
                if isinstance(v, int | float) and k != "reward":
                    values.setdefault(str(k), []).append(float(v))
        out.append(EvalResult(policy=target.policy, version=target.version, task=task, source="pinned",
                              episodes=len(eps), reward=_mean([float(e.reward) for e in eps]),
                              metrics={k: statistics.fmean(v) for k, v in values.items()},
                              metadata={"eval_run": eval_run, "source": target.source, **(extra or {})}))
    return out


def _log_mlflow(c: EvalConfig, target: Target, results: list[EvalResult]) -> str:
    """One MLflow run ``eval <policy> v<N>`` in the training run's experiment; returns its id."""
    import mlflow

    from flows import tracking

    mlflow.set_tracking_uri(tracking.tracking_uri(c.mlflow.tracking_uri))
    mlflow.set_experiment(experiment_id=tracking.ensure_experiment(c.mlflow.experiment))
    tags = {"swarm.task": c.task.name, "swarm.eval_of": f"{target.policy} v{target.version}",
            "swarm.model": str(getattr(c.model, "path", None) or c.model.name or c.model.backend), **c.mlflow.tags}
    if target.training_run_id:
        tags["swarm.training_run_id"] = target.training_run_id
    n = sum(r.episodes for r in results)
    metrics = {"eval/episodes": float(n), "eval/reward": sum(r.reward * r.episodes for r in results) / n}
    sums: dict[str, list[float]] = {}  # metric -> [weighted sum, episodes of the tasks reporting it]
    for r in results:
        for k, v in r.metrics.items():
            acc = sums.setdefault(k, [0.0, 0.0])
            acc[0], acc[1] = acc[0] + v * r.episodes, acc[1] + r.episodes
        if len(results) > 1:
            metrics[f"eval/{r.task}/reward"] = float(r.reward)
    metrics.update({f"eval/{k}": total / count for k, (total, count) in sums.items()})
    with mlflow.start_run(run_name=f"eval {target.policy} v{target.version}", tags=tags) as run:
        tracking.log_metrics(metrics, step=target.version)
        mlflow.log_dict(tracking.redact(c.raw()), "config.json")
        return run.info.run_id


# -- running ------------------------------------------------------------------------------------

def _progress(pool: Lookup, tag: str, total: int, thread: threading.Thread, label: str, every_s: float = 2.0) -> None:
    """A line each time more of the eval's episodes have ended, until the worker thread is done."""
    from swarm.pool import StepFilter

    flt = StepFilter(metadata={"eval_run": tag}, episode_status="finished")
    shown = -1
    while thread.is_alive():
        thread.join(every_s)
        done = len(pool.query_episodes(flt, limit=total + 1))
        if done != shown:
            print(f"{label}: {done}/{total} episodes", flush=True)
            shown = done


def run_eval(c: EvalConfig, stop: threading.Event | None = None) -> Outcome:
    """Evaluate ``c.eval``'s weights on ``c.task``'s held-out seeds through a gateway of its own on ``c.pool``;
    records the results (pool + MLflow) and returns them; stopped early (``stop``): nothing recorded."""
    from flows.components import make_pool, start_gateway
    from swarm.client import WorkerConfig, run_worker
    from swarm.pool import StepFilter
    from swarm.records import new_id

    stop = stop or threading.Event()
    ev = c.eval
    group_size = ev.group_size or c.task.group_size
    total = ev.groups * group_size
    with contextlib.ExitStack() as undo:
        pool = make_pool(c.pool)
        undo.callback(pool.close)
        target = resolve_target(pool, ev)
        label = f"eval {target.policy} v{target.version}"
        print(f"{label}: loading {target.source}", flush=True)
        backend = _backend(c.model, target)
        if callable(getattr(backend, "close", None)):
            undo.callback(backend.close)
        try:
            stack = start_gateway(pool, backend, c.gateway)
        except ValueError as exc:  # check_bind: off loopback without both tokens
            raise ConfigError(f"gateway: {exc}") from None
        undo.callback(stack.stop)
        out = Outcome(target, new_id("evalrun"))
        tags = {"eval_run": out.eval_run, "eval_of": {"policy": target.policy, "version": target.version}}
        wcfg = WorkerConfig(server=stack.url, task=c.task.name, workers=ev.workers, group_size=group_size,
                            model=target.policy, temperature=c.task.temperature, max_tokens=c.task.max_tokens,
                            episode_timeout_s=c.task.episode_timeout_s, seed=ev.seed, max_groups=ev.groups,
                            options=dict(c.task.options), eval_only=True, metadata=tags, seeded=True)
        print(f"{label}: {ev.groups} groups x {group_size} on {c.task.name} seeds {ev.seed}..{ev.seed + ev.groups - 1}"
              f" through {stack.url}", flush=True)
        stats: dict[str, float] = {}
        worker = threading.Thread(target=lambda: stats.update(run_worker(wcfg, stop)), name="eval-worker", daemon=True)
        worker.start()
        _progress(pool, out.eval_run, total, worker, label)
        if stop.is_set():
            return out
        out.failed = int(stats.get("failed", 0))
        episodes = pool.query_episodes(StepFilter(metadata={"eval_run": out.eval_run}), limit=total + 1)
        extra = {"seed": ev.seed, "seeded": True, "groups": ev.groups, "group_size": group_size, "failed": out.failed,
                 "weights": None if target.weights is None else str(target.weights)}
        if target.training_run_id:
            extra["training_run_id"] = target.training_run_id
        results = summarize(episodes, target, out.eval_run, extra)
        if not results:
            raise EvalFailed(f"{label}: no eval episode finished ({out.failed} failed); see the warnings above")
        out.mlflow_run_id = _log_mlflow(c, target, results)
        for r in results:
            out.results.append(pool.add_eval_result(r.model_copy(
                update={"metadata": {**r.metadata, "mlflow_run_id": out.mlflow_run_id}})))
        return out


def summary_line(out: Outcome) -> str:
    """``eval default v3 on echo: 32 episodes, reward 0.412, exact 0.250 (pool eval_results ..., mlflow run ...)``."""
    parts = []
    for r in out.results:
        metrics = "".join(f", {k} {v:.3f}" for k, v in sorted(r.metrics.items()))
        parts.append(f"on {r.task}: {r.episodes} episodes, reward {r.reward:.3f}{metrics}")
    failed = f", {out.failed} failed" if out.failed else ""
    return (f"eval {out.target.policy} v{out.target.version} {'; '.join(parts)}{failed} (pool eval_results "
            f"{', '.join(r.eval_id for r in out.results)}; mlflow run {out.mlflow_run_id})")


# -- command line -------------------------------------------------------------------------------

def cli_config(resolved: dict[str, Any]) -> EvalConfig:
    """The validated EvalConfig of a resolved Hydra tree: task package and options, pool URL (ConfigError)."""

    def checks(light: EvalConfig) -> None:  # before the backend's module (torch) is imported
        check_task(light.task)
        if not os.environ.get("SWARM_POOL_URL"):
            check_pool_url(light.pool.url)

    return validate(resolved, schema=EvalConfig, checks=checks)


@hydra.main(version_base=None, config_path=str(CONF), config_name="eval")
def _hydra_main(cfg: DictConfig) -> None:
    resolved = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(resolved, dict)
    try:
        c = cli_config(resolved)
    except ConfigError as exc:
        fail(str(exc))
    from flows import shutdown  # the heavy imports (torch, MLflow) come after this

    stop = shutdown.STOP.install()  # Ctrl-C / SIGTERM: end the episodes, the gateway, the backend; exit 130 / 143
    t0 = time.perf_counter()
    try:
        out = run_eval(c, stop)
    except ConfigError as exc:  # the version or checkpoint cannot be evaluated (found out once the pool is open)
        fail(str(exc))
    except SwarmError as exc:  # weights that do not fit model=, a gateway that cannot start, no finished episode
        print(f"eval failed: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        sys.exit(1)
    if shutdown.STOP.exit_code is not None:
        print(f"eval stopped: nothing recorded ({time.perf_counter() - t0:.0f}s)", file=sys.stderr, flush=True)
        sys.exit(shutdown.STOP.exit_code)
    print(f"{summary_line(out)} in {time.perf_counter() - t0:.0f}s", flush=True)


def main() -> None:
    """Entry point: quiet library logs, the override check, Hydra, the validated config, the evaluation."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    # peft reads transformers' renamed is_gradient_checkpointing: a library notice, as flows.train hides it
    warnings.filterwarnings("ignore", message=re.escape("`is_gradient_checkpointing` is deprecated"),
                            category=FutureWarning)
    for k, v in {"TRANSFORMERS_VERBOSITY": "error", "HF_HUB_DISABLE_PROGRESS_BARS": "1", "TQDM_DISABLE": "1",
                 "MLFLOW_LOGGING_LEVEL": "WARNING"}.items():
        os.environ.setdefault(k, v)
    overrides = [a for a in sys.argv[1:] if not a.startswith("-") and "=" in a and not a.startswith("hydra.")]
    if any("." in o.split("=", 1)[0] and not o.startswith("+") for o in overrides):
        check_overrides("eval", overrides, EvalConfig)
    _hydra_main()


if __name__ == "__main__":
    main()
