"""The typed run config of ``flows.train``: the composed Hydra tree, validated once in ``main()``.

Light on purpose (pydantic, the standard library and torch-free swarm modules only): a bad value
fails here with one line naming the key, in well under a second, before Prefect, MLflow or torch
are imported. The open groups whose keys depend on the chosen option (``model``, ``algo``,
``runner``, ``gateway``, ``pool``) stay dicts here and are checked by :mod:`flows.components` when
they are built; ``algo`` becomes its torch-free ``TrainConfig`` here (:func:`make_train_config`).
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_serializer, model_validator

from swarm.errors import ConfigError
from swarm.train.config import LoraSpec, TrainConfig

__all__ = ["ConfigError", "RunConfig", "RewardSection", "TaskSection", "TrainSection", "BatchingSection", "MlflowSection",
           "validate", "check_pool_url", "check_task", "unknown_key_hint", "workers_elsewhere", "lora_spec",
           "make_train_config"]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RewardSection(_Section):
    """``task.reward``: where the episodes' rewards come from (conf/reward/judge.yaml, docs/judge.md).

    ``kind: task`` (the default, no block): the task package's own reward. ``kind: judge``: an LLM
    judge scores complete groups (:class:`swarm.judge.JudgeSpec` checks the values).
    """

    kind: Literal["task", "judge"] = "task"
    policy: str = "judge"
    rubric: str | None = None
    scale: list[int] = Field(default_factory=lambda: [0, 10])
    view: Literal["final", "transcript"] = "transcript"
    chunk_size: int = 8
    max_tokens: int = 160
    max_chars: int = 600
    retries: int = 2
    weights: dict[str, float] = Field(default_factory=lambda: {"judge": 1.0, "task": 0.0})
    timeout_s: float = 120.0
    concurrency: int = 4
    poll_s: float = Field(default=0.5, gt=0)
    pool_url: str | None = None  # filled from pool.url by validate(): the judge reads and rewards this pool

    @model_validator(mode="after")
    def _judge_spec(self) -> RewardSection:
        if self.kind == "judge":
            from swarm.judge.spec import JudgeSpec

            JudgeSpec.from_config({k: v for k, v in self.model_dump().items() if v is not None})
        return self


class TaskSection(_Section):
    name: str = Field(min_length=1)
    group_size: int = Field(ge=1)
    temperature: float = Field(gt=0)
    max_tokens: int = Field(ge=1)
    episode_timeout_s: float = Field(gt=0)
    eval_every: int = Field(default=0, ge=0)
    options: dict[str, Any] = Field(default_factory=dict)
    reward: RewardSection | None = None  # None: the task's own reward

    @model_serializer(mode="wrap")
    def _without_default_reward(self, handler: Any) -> dict[str, Any]:
        """No ``reward`` key unless one is set: runs without a judge log the same params as before."""
        out = handler(self)
        if out.get("reward", 0) is None:
            del out["reward"]
        return out


class TrainSection(_Section):
    updates: int = Field(ge=1)
    batch_timeout_s: float = Field(gt=0)
    lease_ttl_s: float = Field(gt=0)
    checkpoint_every: int = Field(default=10, ge=1)
    max_staleness: int | None = Field(default=1, ge=0)
    out_dir: str
    resume: bool = True
    gradient_checkpointing: bool = False
    device: str = "cpu"


class BatchingSection(_Section):
    strategy: Literal["episodes", "groups", "groups_var", "any_agree", "all_agree"]
    min_groups: int = Field(default=1, ge=1)
    min_episodes: int = Field(default=1, ge=1)
    agree_every: int = Field(default=0, ge=0)


class MlflowSection(_Section):
    tracking_uri: str | None = None
    experiment: str = Field(default="swarmpool", min_length=1)
    sample_trajectories: int = Field(default=8, ge=0)
    nested: bool = False
    parent_run_id: str | None = None
    tags: dict[str, str] = Field(default_factory=dict)  # extra MLflow tags (flows.campaign sets swarm.campaign)


class RunConfig(_Section):
    """Everything one ``flows.train`` run needs, validated; ``raw`` keeps the resolved tree for MLflow."""

    model_config = ConfigDict(extra="allow", frozen=True)  # tasks may add top-level keys of their own

    seed: int = 0
    run_name: str | None = None
    task: TaskSection
    policies: list[str] = Field(min_length=1)
    train: TrainSection
    batching: BatchingSection
    mlflow: MlflowSection
    model: dict[str, Any]
    algo: dict[str, Any]
    pool: dict[str, Any]
    runner: dict[str, Any]
    gateway: dict[str, Any] = Field(default_factory=dict)
    frozen_policies: dict[str, dict[str, Any]] = Field(default_factory=dict)  # name -> model config, served, never trained
    overrides: list[str] = Field(default_factory=list)  # the command line's overrides (run name, MLflow tags)

    @model_validator(mode="after")
    def _consistent(self) -> RunConfig:
        if len(set(self.policies)) != len(self.policies):
            raise ValueError("policies: names must be unique")
        for name, model in self.frozen_policies.items():
            if name in self.policies:
                raise ValueError(f"frozen_policies.{name}: {name!r} is also in policies; a policy is either trained "
                                 "(policies) or frozen (frozen_policies), not both")
            if not model.get("backend"):
                raise ValueError(f"frozen_policies.{name}.backend: missing; give a model config, e.g. "
                                 f"+model@frozen_policies.{name}=upstream or +frozen_policies.{name}.backend=hf")
        judge = self.task.reward
        if judge is not None and judge.kind == "judge" and judge.policy not in (*self.policies, *self.frozen_policies):
            raise ValueError(f"task.reward.policy={judge.policy!r}: no such policy; serve a judge with "
                             f"+model@frozen_policies.{judge.policy}=tiny (or =upstream), or name one of "
                             f"{[*self.policies, *self.frozen_policies]}")
        grpo = self.algo.get("name") == "grpo" or self.algo.get("group_by") is not None
        if grpo and self.task.group_size < 2:
            raise ValueError(f"task.group_size={self.task.group_size}: GRPO compares the episodes of a group, "
                             "it needs at least 2")
        workers = self.runner.get("workers", 1)
        if not isinstance(workers, int) or workers < 1:
            raise ValueError(f"runner.workers={workers}: at least 1 concurrent episode per worker is needed")
        if self.batching.strategy == "groups_var" and self.task.group_size < 2:
            raise ValueError("task.group_size: groups_var drops zero-variance groups; it needs at least 2")
        return self

    def raw(self) -> dict[str, Any]:
        """The config as a plain dict (what MLflow logs and subprocess workers receive)."""
        return self.model_dump(mode="json")


def _judge_wiring(data: dict[str, Any]) -> dict[str, Any]:
    """With ``task.reward.kind=judge``: the judge rewards the run's pool (``task.reward.pool_url``), and the
    gateway keeps the agent's own reward of the task in the history (``gateway.reward_authority.<task>:
    judge``) so no group trains before the judge scores it. Explicit settings are kept."""
    task = data.get("task")
    reward = task.get("reward") if isinstance(task, dict) else None
    if not isinstance(reward, dict) or reward.get("kind") != "judge":
        return data
    pool = data.get("pool") if isinstance(data.get("pool"), dict) else {}
    gateway = dict(data.get("gateway") or {})
    authority = dict(gateway.get("reward_authority") or {})
    name = str(task.get("name"))
    for recorded in {name, name.rsplit(".", 1)[-1]}:  # a module path's episodes are recorded under its last name
        authority.setdefault(recorded, "judge")
    gateway["reward_authority"] = authority
    reward = {**reward, "pool_url": reward.get("pool_url") or pool.get("url")}
    return {**data, "task": {**task, "reward": reward}, "gateway": gateway}


def _where(loc: tuple[Any, ...]) -> str:
    return ".".join(str(p) for p in loc)


def validate(resolved: dict[str, Any], overrides: list[str] | None = None) -> RunConfig:
    """The RunConfig of a resolved config tree; raises :class:`ConfigError` with one line per problem."""
    data = _judge_wiring({k: v for k, v in resolved.items() if k != "hydra"})
    if overrides is not None:
        data["overrides"] = list(overrides)
    try:
        return RunConfig.model_validate(data)
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            key = _where(err["loc"])
            msg = err["msg"].removeprefix("Value error, ")
            if err["type"] == "extra_forbidden":
                section, _, leaf = key.rpartition(".")
                hint = unknown_key_hint(leaf, _section_keys(section, data), cutoff=0.6, section=section)
                lines.append(f"{key}: unknown key{hint}")
            elif err["type"] == "missing":
                lines.append(f"{key}: missing (set {key}=...)")
            elif key and msg.startswith(key + "."):  # the message names its key already (task.reward.<key>)
                lines.append(msg)
            elif key:
                lines.append(f"{key}={_value(data, err['loc'])}: {msg}")
            else:
                lines.append(msg)
        raise ConfigError("; ".join(lines)) from None


def _value(data: dict[str, Any], loc: tuple[Any, ...]) -> Any:
    cur: Any = data
    for p in loc:
        try:
            cur = cur[p]
        except (KeyError, IndexError, TypeError):
            return "?"
    return cur


def _section_keys(section: str, data: dict[str, Any]) -> list[str]:
    """The names a config ``section`` ('' for the top level) may hold: its model's fields, else its keys."""
    fields = RunConfig.model_fields.get(section)
    if fields is not None and isinstance(fields.annotation, type) and issubclass(fields.annotation, BaseModel):
        return list(fields.annotation.model_fields)
    return list(_value(data, tuple(section.split("."))).keys()) if section else list(data)


def unknown_key_hint(key: str, known: list[str], *, cutoff: float = 0.75, section: str = "") -> str:
    """`` (did you mean train.updates?)`` for a mistyped ``key`` among ``known``, '' if none is close.

    ``key`` and ``known`` are dotted keys; or, with ``section``, the names inside that section (the
    suggestion is then spelled ``section.name``).
    """
    close = difflib.get_close_matches(key, known, n=1, cutoff=cutoff)
    return f" (did you mean {section + '.' if section else ''}{close[0]}?)" if close else ""


def workers_elsewhere(runner: dict[str, Any]) -> bool:
    """Whether this run starts no client workers in this environment (``runner=process
    runner.processes=0``, or Ray on an existing cluster): the task package may then live only there."""
    kind = runner.get("kind", "thread")
    return (kind == "process" and int(runner.get("processes", 1)) == 0) or (kind == "ray" and bool(runner.get("address")))


def check_task(task: TaskSection, runner: dict[str, Any] | None = None) -> None:
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
        raise ConfigError(f"task.options: {exc}") from None
    if task.reward is not None and task.reward.kind == "judge" and package.run_multiagent is not None:
        raise ConfigError(f"task.reward.kind=judge: {task.name} is a multi-agent game (run_multiagent), whose group "
                          "is one game of several seats; the judge scores groups of run_episode episodes")


def check_pool_url(url: str, timeout_s: float = 3.0) -> None:
    """Fail fast (one line) when ``pool.url`` cannot work: unknown scheme, unwritable SQLite folder,
    unreachable or refusing database server. Costs one short connect; the Pool itself retries."""
    import sqlalchemy as sa
    from sqlalchemy.exc import ArgumentError, NoSuchModuleError, SQLAlchemyError

    try:
        parsed = sa.engine.make_url(url)
    except ArgumentError:
        raise ConfigError(f"pool.url={url!r}: not a database URL; use sqlite:///path/pool.db or "
                          "postgresql+psycopg://user@host:5432/db") from None
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        if parsed.database and parsed.database != ":memory:":
            folder = Path(parsed.database).expanduser().resolve().parent
            try:
                folder.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise ConfigError(f"pool.url={url!r}: cannot create {folder}: {exc.strerror}") from None
        return
    if backend != "postgresql":
        raise ConfigError(f"pool.url={url!r}: unsupported database {backend!r}; use sqlite or postgresql")
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


def lora_spec(algo: dict[str, Any]) -> LoraSpec | None:
    """The LoRA adapter of ``algo.lora`` (None: train every weight)."""
    lora = algo.get("lora")
    if not lora:
        return None
    return LoraSpec(rank=int(lora.get("rank", 8)), alpha=float(lora.get("alpha", 16)),
                    dropout=float(lora.get("dropout", 0.0)),
                    target_modules=tuple(lora.get("target_modules", ("q_proj", "v_proj"))))


def make_train_config(algo: dict[str, Any], temperature: float, pad_id: int) -> TrainConfig:
    """The trainer's settings from the ``algo`` group (ConfigError names the bad field). Torch-free, so
    ``cli_config`` checks them before anything heavy is imported."""
    keys = ("lr", "weight_decay", "max_grad_norm", "clip_low", "clip_high", "ratio", "tis_cap", "kl_coef",
            "loss_agg", "merge", "token_budget", "attention")
    kw = {k: algo[k] for k in keys if k in algo}
    try:
        return TrainConfig(**kw, lora=lora_spec(algo), temperature=temperature, pad_id=pad_id)
    except (TypeError, ValueError) as exc:
        msg = str(exc)  # TrainConfig names its fields train.<name>: say the key the user sets
        if msg.startswith("train.temperature"):
            raise ConfigError("task." + msg.removeprefix("train.")) from exc
        raise ConfigError("algo." + msg.removeprefix("train.") if msg.startswith("train.") else f"algo: {msg}") from exc
