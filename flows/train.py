"""``python -m flows.train [+task=NAME] [key=value ...] [-v]``: the training run's command line.

Composes ``conf/train.yaml`` with Hydra, validates it into one typed :class:`flows.config.RunConfig`
and checks ``pool.url`` before anything heavy is imported: a bad value or a mistyped key is one
line naming the key, in about a second, exit code 2. Then :func:`flows.run.run_main` runs the
flow (the flow itself, :func:`train_flow`, lives in :mod:`flows.run`).

Quiet by default: Prefect's server and flow-run lines, transformers warnings and weight-loading
bars, MLflow's table-creation lines stay hidden; ``-v`` / ``--verbose`` shows them. Every file a
run writes goes under its run folder (``train.out_dir``, default ``outputs/<task>/<time>/``:
Hydra's ``.hydra`` too) and the MLflow store (default ``outputs/mlruns.db`` with artifacts in
``outputs/mlartifacts/``).
"""

from __future__ import annotations

import os
import re
import sys
import warnings
from typing import Any

import hydra
from omegaconf import DictConfig, OmegaConf

from flows.cli import CONF, check_overrides, fail
from flows.config import ConfigError, RunConfig, check_pool_url, check_task, validate

__all__ = ["main", "cli_config"]  # train_flow, run_update, follow_flow: lazily from flows.run

_QUIET_ENV = {
    "PREFECT_LOGGING_LEVEL": "WARNING",  # flow/task-run lines, the temporary server's banner
    "PREFECT_SERVER_LOGGING_LEVEL": "WARNING",
    "TRANSFORMERS_VERBOSITY": "error",
    "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1",
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",  # weight-loading bars
    "TQDM_DISABLE": "1",
    "MLFLOW_LOGGING_LEVEL": "WARNING",  # "Creating initial MLflow database tables...", alembic
}

_PEFT_NOTICE = "`is_gradient_checkpointing` is deprecated"  # transformers' FutureWarning, as peft triggers it


def __getattr__(name: str) -> Any:
    """``from flows.train import train_flow`` still works; the flow module is imported only when used."""
    if name in ("train_flow", "run_update", "follow_flow"):
        from flows import run

        return getattr(run, name)
    raise AttributeError(name)


def _prepare_argv(argv: list[str]) -> tuple[list[str], bool]:
    """(argv for Hydra, verbose): strips ``-v``; a ``train.out_dir=X`` also puts Hydra's own files in X."""
    verbose = any(a in ("-v", "--verbose") for a in argv[1:])
    args = [a for a in argv[1:] if a not in ("-v", "--verbose")]
    outs = [a.split("=", 1)[1] for a in args if a.startswith("train.out_dir=")]
    if outs and not any(a.startswith("hydra.run.dir=") for a in args):
        args.append(f"hydra.run.dir={outs[-1]}")
    return [argv[0], *args], verbose


def cli_config(cfg: DictConfig, overrides: list[str]) -> RunConfig:
    """The validated RunConfig of a composed Hydra config (ConfigError: one line naming the key)."""
    resolved = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(resolved, dict)

    def checks(light: RunConfig) -> None:  # before the backend's module (torch) is imported
        check_task(light.task, light.runner)
        if not os.environ.get("SWARM_POOL_URL"):
            check_pool_url(light.pool.url)
        if gguf := (resolved.get("model") or {}).get("gguf"):  # the GGUF file (or its package) exists: no traceback
            from swarm.errors import ValidationError
            from swarm.policy.gguf import resolve_gguf

            try:
                resolve_gguf(str(gguf))
            except ValidationError as exc:
                raise ConfigError(str(exc)) from None

    run: RunConfig = validate(resolved, overrides, checks=checks)
    return run


@hydra.main(version_base=None, config_path=str(CONF), config_name="train")
def _hydra_main(cfg: DictConfig) -> None:
    from hydra.core.hydra_config import HydraConfig

    try:
        run = cli_config(cfg, list(HydraConfig.get().overrides.task))
    except ConfigError as exc:
        fail(str(exc))
    from flows import run as run_mod  # the heavy imports (Prefect, MLflow, torch) start here
    from flows import shutdown

    shutdown.STOP.install()  # Ctrl-C / SIGTERM: finish the update, checkpoint, exit 130 / 143
    run_mod.run_main(run)
    if shutdown.STOP.exit_code is not None:
        sys.exit(shutdown.STOP.exit_code)


def main() -> None:
    """Entry point: argv -> quiet settings -> override check -> Hydra -> validated config -> the flow."""
    sys.argv, verbose = _prepare_argv(sys.argv)
    if not verbose:
        for k, v in _QUIET_ENV.items():
            os.environ.setdefault(k, v)
        # peft reads transformers' renamed is_gradient_checkpointing: a library notice, not the user's.
        # Only that one: other warnings still show (the env var carries it to worker processes).
        os.environ.setdefault("PYTHONWARNINGS", f"ignore:{_PEFT_NOTICE}:FutureWarning")
        warnings.filterwarnings("ignore", message=re.escape(_PEFT_NOTICE), category=FutureWarning)
    overrides = [a for a in sys.argv[1:] if not a.startswith("-") and "=" in a and not a.startswith("hydra.")]
    dotted = any("." in o.split("=", 1)[0] and not o.startswith("+") for o in overrides)
    if dotted and not any(a.startswith(("--config-dir", "-cd", "--config-path", "-cp", "--config-name", "-cn"))
                          for a in sys.argv[1:]):
        check_overrides("train", overrides, add_hint=True)
    _hydra_main()


if __name__ == "__main__":
    main()
