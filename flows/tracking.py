"""MLflow for the flows: one run per flow run, named for what differs (``echo lr=0.001 seed=1``),
tagged ``swarm.task`` / ``swarm.model`` / ``swarm.campaign``, the flattened config as params (minus
paths and ports, which differ in every run), slash-namespaced metrics with ``step`` = policy
version, ``summary/*`` run metrics to sort by, readable trajectories and merge stats as artifacts.

Store: an explicit ``mlflow.tracking_uri``, else ``MLFLOW_TRACKING_URI`` (MLflow exports it itself, so
alone it cannot mean "the user's choice"), else ``sqlite:///outputs/mlruns.db``, whose experiments
keep artifacts in ``mlartifacts/`` beside it, never in the current directory.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import mlflow

from flows.config import RunConfig
from swarm.pool import StepFilter
from swarm.records import Step

__all__ = ["DEFAULT_URI", "tracking_uri", "redact", "flatten", "run_name", "run_params", "run_tags",
           "ensure_experiment", "open_run", "log_curation", "log_metrics", "flush", "log_summary", "render_trajectory", "log_text",
           "log_warning"]

DEFAULT_URI = "sqlite:///outputs/mlruns.db"
# config keys that differ in every run (paths, ports, ids): neither params nor part of a run's name
VOLATILE = ("train.out_dir", "pool.url", "gateway.port", "gateway.host", "mlflow.tracking_uri", "mlflow.nested",
            "mlflow.parent_run_id", "mlflow.tags", "mlflow.experiment", "run_name", "train.resume", "overrides",
            "hydra")


def tracking_uri(configured: str | None) -> str:
    return configured or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_URI


def _volatile(key: str) -> bool:
    return any(key == v or key.startswith(v + ".") for v in VOLATILE)


def run_name(cfg: RunConfig) -> str:
    """``cfg.run_name``, else the task and the command line's overrides that change the run
    (``echo lr=0.001 seed=1``), else the task and a timestamp."""
    if cfg.run_name:
        return cfg.run_name
    parts = []
    for o in cfg.overrides:
        key, sep, value = o.lstrip("+~").partition("=")
        if not sep or _volatile(key) or key == "task":
            continue
        parts.append(f"{key.rsplit('.', 1)[-1]}={value}")
    return " ".join([cfg.task.name, *parts]) if parts else f"{cfg.task.name}-{time.strftime('%Y%m%d-%H%M%S')}"


def run_params(cfg: RunConfig) -> dict[str, str]:
    """The flattened config minus :data:`VOLATILE` keys: what can differ between comparable runs."""
    return {k: v for k, v in flatten(cfg.raw()).items() if not _volatile(k)}


def run_tags(cfg: RunConfig) -> dict[str, str]:
    """``swarm.task``, ``swarm.model`` (the checkpoint or the model config's name), plus ``mlflow.tags``."""
    model = getattr(cfg.model, "path", None) or cfg.model.name or cfg.model.backend
    return {"swarm.task": cfg.task.name, "swarm.model": str(model), **cfg.mlflow.tags}


def ensure_experiment(name: str) -> str:
    """The id of experiment ``name``, created if missing; on a SQLite store its artifacts go to
    ``mlartifacts/`` beside the database file (MLflow's default is ``./mlruns`` in the current directory)."""
    client = mlflow.tracking.MlflowClient()
    exp = client.get_experiment_by_name(name)
    if exp is not None:
        return exp.experiment_id
    uri = mlflow.get_tracking_uri()
    location = None
    if uri.startswith("sqlite:///"):
        db = Path(uri.removeprefix("sqlite:///")).resolve()
        db.parent.mkdir(parents=True, exist_ok=True)
        location = (db.parent / "mlartifacts" / name).as_uri()
    try:
        return client.create_experiment(name, artifact_location=location)
    except mlflow.exceptions.MlflowException:  # another process created it first
        exp = client.get_experiment_by_name(name)
        if exp is None:
            raise
        return exp.experiment_id


_SECRET_KEYS = ("api_key", "apikey", "password", "secret", "access_token", "auth_token", "hf_token")


def redact(cfg: Any) -> Any:
    """The config with string values of secret-looking keys (``api_key``, ``*secret*``, ...) replaced by ``***``."""
    if isinstance(cfg, dict):
        return {k: "***" if isinstance(v, str) and any(s in str(k).lower() for s in _SECRET_KEYS)
                and not str(k).lower().endswith("_env") else redact(v) for k, v in cfg.items()}
    if isinstance(cfg, list):
        return [redact(v) for v in cfg]
    return cfg


def flatten(cfg: Any, prefix: str = "") -> dict[str, str]:
    """``{"algo.lr": "0.002", ...}``: MLflow params (values truncated to MLflow's 6000 chars)."""
    out: dict[str, str] = {}
    if isinstance(cfg, dict):
        for k, v in redact(cfg).items():
            out.update(flatten(v, f"{prefix}{k}."))
    else:
        out[prefix[:-1]] = json.dumps(cfg)[:6000] if isinstance(cfg, list) else str(cfg)[:6000]
    return out


def open_run(cfg: RunConfig, continue_run_id: str | None = None) -> mlflow.ActiveRun:
    """Start the run with its name, tags, params and the resolved config; the caller ends it.

    ``mlflow.nested``: a child of the active run; ``mlflow.parent_run_id``: a child of that run (another
    process). ``continue_run_id``: reopen that run (a resumed run keeps one history) if this store has
    it; its params stay, the new config is logged as an artifact.
    """
    mcfg = cfg.mlflow
    mlflow.set_tracking_uri(tracking_uri(mcfg.tracking_uri))
    experiment_id = ensure_experiment(mcfg.experiment)
    mlflow.set_experiment(experiment_id=experiment_id)
    config = redact(cfg.raw())  # secrets come from the environment, never the run
    if continue_run_id is not None:
        try:
            mlflow.tracking.MlflowClient().get_run(continue_run_id)
        except mlflow.exceptions.MlflowException:
            continue_run_id = None  # another tracking store: start a new run
    if continue_run_id is not None:
        run = mlflow.start_run(run_id=continue_run_id, nested=mcfg.nested)
        mlflow.log_dict(config, f"config-resumed-{int(time.time())}.json")
        return run
    run = mlflow.start_run(run_name=run_name(cfg), nested=mcfg.nested, parent_run_id=mcfg.parent_run_id,
                           tags=run_tags(cfg))
    mlflow.log_params(run_params(cfg))
    mlflow.log_dict(config, "config.json")
    return run


def log_curation(ref: str | None, flt: StepFilter | None) -> None:
    """The run's curated set (docs/pool.md "Curated sets") as params: ``curation.ref`` (``name@version``,
    or ``inline`` for ``train.filter``) and ``curation.filter`` (its JSON); nothing without one."""
    if flt is None:
        return
    params = {"curation.ref": ref or "inline",
              "curation.filter": json.dumps(flt.model_dump(mode="json", exclude_defaults=True), sort_keys=True)[:6000]}
    try:
        mlflow.log_params(params)
    except mlflow.exceptions.MlflowException:  # a resumed run trained on another version: params are immutable
        mlflow.log_dict(params, f"curation-resumed-{int(time.time())}.json")


def log_metrics(metrics: dict[str, float], step: int, wait: bool = True) -> None:
    """``metrics`` at ``step`` of the active run; ``wait=False`` queues them on MLflow's own logging thread
    (an update's row: ~0.1 s of SQLite writes off the training loop), :func:`flush` writes the queue."""
    clean = {k.replace(":", "_"): float(v) for k, v in metrics.items() if v is not None}
    mlflow.log_metrics(clean, step=step, synchronous=wait)


def flush() -> None:
    """Write every row queued by ``log_metrics(..., wait=False)`` (before reading them back or ending the run)."""
    mlflow.flush_async_logging()


def log_summary(summary: dict[str, float]) -> None:
    """The run's summary numbers as ``summary/<key>`` metrics, so the runs table can sort by them."""
    mlflow.log_metrics({f"summary/{k}": float(v) for k, v in summary.items()})


def render_trajectory(steps: Sequence[Step], decode: Callable[[list[int]], str]) -> str:
    """Markdown of one episode's steps: messages (or decoded prompt), the reply, reward, version."""
    lines = []
    for s in steps:
        lines.append(f"### step {s.index} · policy {s.policy} v{s.policy_version} · reward {s.reward}")
        if s.prompt_messages:
            for m in s.prompt_messages:
                lines.append(f"- **{m.get('role')}**: {m.get('content')!s}")
        else:
            lines.append(f"```\n{decode(s.prompt_ids)}\n```")
        reply = s.response_text if s.response_text is not None else decode(s.response_ids)
        lines.append(f"- **assistant** ({len(s.response_ids)} tokens): {reply}")
        if s.tool_calls:
            lines.append(f"- tool calls: `{json.dumps(s.tool_calls)}`")
        lines.append("")
    return "\n".join(lines)


def log_warning(text: str) -> None:
    """A run health warning (flows.run) as the run's ``swarm.warning`` tag (the latest; MLflow keeps one value)."""
    if mlflow.active_run() is not None:
        mlflow.set_tag("swarm.warning", text[:5000])


def log_text(text: str, path: str) -> None:
    mlflow.log_text(text, path)


def log_dir(directory: str | Path, artifact_path: str) -> None:
    if Path(directory).exists():
        mlflow.log_artifacts(str(directory), artifact_path)
