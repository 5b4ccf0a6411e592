"""MLflow for the flows: one run per flow run, flattened config as params, slash-namespaced
metrics with ``step`` = policy version, readable trajectories and merge stats as artifacts.

Local SQLite store (``sqlite:///mlruns.db``) by default; ``MLFLOW_TRACKING_URI`` wins over that
default, and an explicit ``mlflow.tracking_uri`` in the config wins over both (MLflow itself
exports the variable on ``set_tracking_uri``, so the variable alone cannot mean "the user's choice").
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import mlflow

__all__ = ["tracking_uri", "redact", "flatten", "open_run", "log_metrics", "render_trajectory", "log_text"]


def tracking_uri(configured: str | None) -> str:
    return configured or os.environ.get("MLFLOW_TRACKING_URI") or "sqlite:///mlruns.db"


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


def open_run(uri: str | None, experiment: str, run_name: str, config: dict[str, Any],
             nested: bool = False, parent_run_id: str | None = None,
             continue_run_id: str | None = None) -> mlflow.ActiveRun:
    """Start the run, log params and the resolved config; the caller ends it (``with``).

    ``nested``: a child of the active run; ``parent_run_id``: a child of that run (another process).
    ``continue_run_id``: reopen that run (a resumed training run keeps one history) when it
    exists in this tracking store; its params stay, the new config is logged as an artifact.
    """
    mlflow.set_tracking_uri(tracking_uri(uri))
    mlflow.set_experiment(experiment)
    if continue_run_id is not None:
        try:
            mlflow.tracking.MlflowClient().get_run(continue_run_id)
        except mlflow.exceptions.MlflowException:
            continue_run_id = None  # another tracking store: start a new run
    if continue_run_id is not None:
        run = mlflow.start_run(run_id=continue_run_id, nested=nested)
        mlflow.log_dict(config, f"config-resumed-{int(time.time())}.json")
        return run
    run = mlflow.start_run(run_name=run_name, nested=nested, parent_run_id=parent_run_id)
    mlflow.log_params(flatten(config))
    mlflow.log_dict(redact(config), "config.json")  # secrets come from the environment, never the run
    return run


def log_metrics(metrics: dict[str, float], step: int) -> None:
    clean = {k.replace(":", "_"): float(v) for k, v in metrics.items() if v is not None}
    mlflow.log_metrics(clean, step=step)


def render_trajectory(steps: list[Any], decode: Any) -> str:
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


def log_text(text: str, path: str) -> None:
    mlflow.log_text(text, path)


def log_dir(directory: str | Path, artifact_path: str) -> None:
    if Path(directory).exists():
        mlflow.log_artifacts(str(directory), artifact_path)
