"""Run-time checks of a validated config: the ones that import a task package or open a database.

Kept out of the schema (:mod:`flows.config.schema`) so validating a config never imports task code or
connects anywhere; ``flows.train`` / ``flows.eval`` call these once, right after validation, so a bad
task option or an unreachable pool stops the run before anything starts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import ValidationError

from flows.config.schema import PoolSection, ProcessRunner, RayRunner, Runner, TaskSection
from swarm.errors import ConfigError
from swarm.train.config import TrainConfig

__all__ = ["workers_elsewhere", "check_task", "check_pool_url", "make_train_config"]


def workers_elsewhere(runner: Runner) -> bool:
    """Whether this run starts no client workers in this environment (``runner=process
    runner.processes=0``, or Ray on an existing cluster): the task package may then live only there."""
    return (isinstance(runner, ProcessRunner) and runner.processes == 0) or (
        isinstance(runner, RayRunner) and bool(runner.address))


def check_task(task: TaskSection, runner: Runner | None = None) -> None:
    """Fail fast (one line) when ``task.name`` is not a task package or ``task.options`` are wrong for it,
    so a bad option stops the run before anything starts rather than failing every episode.

    When the workers run elsewhere (:func:`workers_elsewhere`) and the package is not importable
    here, nothing is checked: the workers load it and report their own errors.
    """
    from swarm.client.task import check_options, load_task

    try:
        package = load_task(task.name)
    except ValueError as exc:
        if runner is not None and workers_elsewhere(runner) and isinstance(exc.__cause__, ModuleNotFoundError):
            return
        raise ConfigError(f"task.name={task.name!r}: {exc}") from None
    except Exception as exc:  # the package exists but fails to import: say so in one line
        raise ConfigError(f"task.name={task.name!r}: importing it failed: {type(exc).__name__}: {exc}") from None
    try:
        check_options(package, task.options)
    except (ValueError, TypeError, AttributeError) as exc:  # a wrong type reaches the package's checks too
        msg = str(exc)  # the SDK's messages name task.options.<key> themselves
        raise ConfigError(msg if msg.startswith("task.options") else f"task.options: {msg}") from None
    if task.reward is not None and task.reward.kind == "judge" and package.run_multiagent is not None:
        raise ConfigError(f"task.reward.kind=judge: {task.name} is a multi-agent game (run_multiagent), whose group "
                          "is one game of several seats; the judge scores groups of run_episode episodes")


def check_pool_url(url: str, timeout_s: float = 3.0) -> None:
    """Fail fast (one line) when ``pool.url`` cannot work: unknown scheme, unwritable SQLite folder,
    unreachable or refusing database server. Costs one short connect; the Pool itself retries."""
    import sqlalchemy as sa
    from sqlalchemy.exc import ArgumentError, NoSuchModuleError, SQLAlchemyError

    try:
        parsed = sa.engine.make_url(PoolSection(url=url).url)
    except (ArgumentError, ValidationError) as exc:
        raise ConfigError(exc.errors()[0]["msg"].removeprefix("Value error, ") if isinstance(exc, ValidationError)
                          else f"pool.url={url!r}: {exc}") from None
    if parsed.get_backend_name() == "sqlite":
        if parsed.database and parsed.database != ":memory:":
            folder = Path(parsed.database).expanduser().resolve().parent
            try:
                folder.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise ConfigError(f"pool.url={url!r}: cannot create {folder}: {exc.strerror}") from None
        return
    try:
        engine = sa.create_engine(parsed, connect_args={"connect_timeout": max(1, int(timeout_s))},
                                  poolclass=sa.pool.NullPool)
    except (NoSuchModuleError, ImportError) as exc:
        raise ConfigError(f"pool.url={url!r}: no driver for it ({exc}); use postgresql+psycopg://...") from None
    try:
        with engine.connect():
            pass
    except SQLAlchemyError as exc:
        cause = str(getattr(exc, "orig", None) or exc).strip().splitlines()
        reason = cause[0] if cause else type(exc).__name__
        raise ConfigError(f"pool.url={parsed.render_as_string(hide_password=True)}: cannot connect: {reason}") from None
    finally:
        engine.dispose()


def make_train_config(algo: Any, temperature: float, pad_id: int) -> TrainConfig:
    """The trainer's settings from the ``algo`` section and the sampling temperature (ConfigError names the key)."""
    try:
        return algo.train_config(temperature, pad_id)
    except ValueError as exc:
        raise ConfigError(str(exc).replace("train.temperature", "task.temperature").replace("train.", "algo.")) from None


