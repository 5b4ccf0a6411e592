"""The schema of ``flows.train`` / ``flows.serve`` / ``flows.eval``: the composed Hydra tree's sections, validated once.

Every group is a section that refuses unknown keys (the top level too). The extension points are not
listed here: ``model`` (and each ``frozen_policies`` entry, and a fleet's replicas) holds any kind
declared in :data:`swarm.policy.settings.BACKENDS`, ``task.reward`` any kind of
:data:`swarm.rewards.REWARDS`; :func:`validate` loads the kinds a config names first. ``algo`` holds
:class:`~swarm.train.TrainConfig`'s fields (its defaults) plus the advantage settings; ``gateway`` is
:class:`~swarm.web.settings.GatewaySettings`' fields (derived) plus where it listens. Messages come from
:mod:`swarm.explain`; checks that import a task or open a database are in :mod:`flows.config.checks`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any, Literal, Union, get_type_hints

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model, model_serializer, model_validator

from swarm.errors import ConfigError
from swarm.explain import explain, unknown_key_hint
from swarm.policy.settings import BACKENDS, BackendSection
from swarm.rewards import REWARDS, RewardSection
from swarm.settings import Kinds, Section, derive
from swarm.train.config import TrainConfig
from swarm.web.settings import GatewaySettings

if TYPE_CHECKING:
    from swarm.train.feedback import RatingRule

Tree = dict[str, Any]  # a resolved Hydra tree, or part of one: untyped until validate() types it

__all__ = ["RunConfig", "ServeConfig", "TaskSection", "TrainSection", "BatchingSection", "MlflowSection",
           "AlgoSection", "PoolSection", "GatewaySection", "Model", "Reward", "ThreadRunner", "ProcessRunner",
           "RayRunner", "Runner", "validate", "model_section", "FeedbackSection", "EvalSection", "EvalConfig",
           "EVAL_SEED", "Tree"]

_Section = Section
Model = Annotated[BackendSection, Kinds(BACKENDS)]  # any declared backend's section, told apart by ``backend``
Reward = Annotated[RewardSection, Kinds(REWARDS)]  # any declared reward kind's section, told apart by ``kind``


class PoolSection(_Section):
    """``pool``: where the data pool lives, and its engine's own settings (swarm/pool/engines: SQLite's
    ``busy_timeout_s``, ...; checked by the engine's section, a mistyped key named with the close one)."""

    model_config = ConfigDict(extra="allow", frozen=True)  # the engine's keys: checked by _engine below

    url: str  # sqlite:///file.db or postgresql+psycopg://...; $SWARM_POOL_URL wins (flows.components.make_pool)
    block_size: int = Field(default=64, ge=1)
    engine: str | None = None  # None: from the URL's scheme; or a module path declaring a pool engine

    @model_validator(mode="after")
    def _engine(self) -> PoolSection:
        from swarm.errors import ValidationError as RecordError
        from swarm.pool.engines import engine_section

        try:
            engine_section(**self.open_args())  # ConfigError: pool.<key> with the close one
        except RecordError as exc:  # an unknown URL scheme (no engine module declares it)
            raise ValueError(f"pool.url={self.url}: {exc.message.removeprefix('url: ')}") from None
        return self

    def open_args(self, url: str | None = None) -> dict[str, Any]:
        """:func:`swarm.pool.open_pool`'s keyword arguments (``url``: another URL for the same settings)."""
        return {"url": url or self.url, "engine": self.engine, "block_size": self.block_size, **(self.model_extra or {})}


class _Runner(_Section):
    workers: int = Field(default=8, ge=1)  # concurrent episodes per worker


class ThreadRunner(_Runner):
    kind: Literal["thread"]


class ProcessRunner(_Runner):
    kind: Literal["process"]
    processes: int = Field(default=2, ge=0)  # 0: the workers run elsewhere


class RayRunner(_Runner):
    kind: Literal["ray"]
    tasks: int = Field(default=2, ge=1)
    address: str | None = None
    task_cpus: float = 0.25
    num_cpus: float | None = None
    node_ip: str = "127.0.0.1"
    home: str | None = None
    namespace: str = "swarmpool"
    server: str | None = None
    prefect_api_url: str | None = None


Runner = Annotated[Union[ThreadRunner, ProcessRunner, RayRunner], Field(discriminator="kind")]  # noqa: UP007


class _Algo(_Section):
    name: str = "grpo"
    group_by: Literal["group", "task_role", "group_role"] = "group"  # which episodes compare their rewards
    scale_std: bool = True  # GRPO std scaling of advantages (false: Dr.GRPO-style mean only)

    def train_config(self, temperature: float = 1.0, pad_id: int = 0) -> TrainConfig:
        """The trainer's settings (``temperature``: the sampling temperature)."""
        kw = self.model_dump(exclude={"name", "group_by", "scale_std", "lora"})
        return TrainConfig(**kw, lora=self.lora, temperature=temperature, pad_id=pad_id)  # type: ignore[attr-defined]

    @model_validator(mode="after")
    def _trainer_accepts(self) -> _Algo:
        try:
            self.train_config()
        except ValueError as exc:
            raise ValueError(str(exc).replace("train.", "algo.", 1)) from None
        return self


AlgoSection = create_model("AlgoSection", __base__=_Algo, __module__=__name__, **{  # TrainConfig's fields and defaults
    f.name: (get_type_hints(TrainConfig)[f.name], Field(default_factory=f.default_factory)
             if f.default is dataclasses.MISSING else f.default)
    for f in dataclasses.fields(TrainConfig) if f.name not in ("temperature", "pad_id")})
AlgoSection.__doc__ = "``algo``: TrainConfig's fields (its defaults), the advantage settings, ``lora`` (null: full)."


_Pos = Annotated[int, Field(ge=1)]
_Secs = Annotated[float, Field(gt=0)]


class _Listen(_Section):
    host: str = "127.0.0.1"
    port: int = Field(default=8420, ge=0, le=65535)  # 0: a free port
    log_level: Literal["critical", "error", "warning", "info", "debug", "trace"] = "warning"  # uvicorn's
    follow_versions_s: float = Field(default=0.0, ge=0)  # > 0: load the pool's newer policy versions this often


class GatewaySection(derive(GatewaySettings, skip=("secret", "client_token", "admin_token", "tool_call_markers"),
                            base=_Listen)):  # type: ignore[misc]
    """``gateway``: where it listens, and :class:`GatewaySettings`' fields (the secrets come from the environment)."""

    def settings(self, reward_authority: dict[str, str] | None = None) -> GatewaySettings:
        """GatewaySettings from these keys and the SWARM_* secrets in the environment; ``reward_authority``
        (a reward kind's needs, e.g. the judge's) fills tasks the ``reward_authority`` key leaves unset."""
        args = self.args()
        args["reward_authority"] = {**(reward_authority or {}), **(args["reward_authority"] or {})}
        return GatewaySettings.from_env(**args)


class TaskSection(_Section):
    name: str = Field(min_length=1)
    group_size: int = Field(ge=1)
    temperature: float = Field(gt=0)
    max_tokens: int = Field(ge=1)
    episode_timeout_s: float = Field(gt=0)
    eval_every: int = Field(default=0, ge=0)
    seeded: bool = False  # each call carries a sampling seed of (instance seed, group member, call) (WorkerConfig.seeded)
    options: Tree = Field(default_factory=dict)  # the task's own schema (its Options) checks them
    reward: Reward | None = None  # None: the task's own reward (swarm/rewards)

    @model_serializer(mode="wrap")
    def _without_default_reward(self, handler: Any) -> Tree:
        """No ``reward`` key unless one is set: runs without a judge log the same params as before."""
        out = handler(self)
        if out.get("reward", 0) is None:
            del out["reward"]
        if out.get("seeded") is False:  # nor a ``seeded`` key unless set
            del out["seeded"]
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
    # what the lease takes from (docs/pool.md "Curated sets"): a saved curation "name" / "name@version",
    # or an inline StepFilter block; either is combined with what training needs (swarm.loop.trainable_filter)
    curation: str | None = None
    filter: Tree | None = None  # StepFilter fields (checked below; the pool is imported only when one is set)
    wait_for_client: bool = False  # wait, model loaded and gateway up, for POST /v1/control/start (swarm.control)

    @model_validator(mode="after")
    def _one_selection(self) -> TrainSection:
        if self.curation is not None and self.filter is not None:
            raise ValueError(f"train.curation={self.curation} and train.filter are both set; keep one (save the "
                             "filter as a curation, or drop train.curation)")
        if self.curation is not None:
            from swarm.pool.curations import parse_ref

            try:
                parse_ref(self.curation)
            except ValueError as exc:
                raise ValueError(f"train.curation={self.curation}: {exc}") from None
        if self.filter is not None:
            self.step_filter()
        return self

    def step_filter(self) -> Any:
        """``train.filter`` as a :class:`~swarm.pool.StepFilter` (None: unset); a ValueError names the bad key."""
        if self.filter is None:
            return None
        from swarm.pool.filter import StepFilter

        try:
            return StepFilter.model_validate(self.filter)
        except ValidationError as exc:
            raise ValueError("; ".join(_filter_error(e, self.filter) for e in exc.errors())) from None


def _filter_error(err: Any, given: Tree) -> str:
    """One ``train.filter`` problem as a line naming the key (and the close one for a mistyped key)."""
    from swarm.pool.filter import StepFilter

    loc = [str(p) for p in err["loc"]]
    key = ".".join(["train.filter", *loc])
    if err["type"] == "extra_forbidden":
        return f"{key}: unknown key{unknown_key_hint(loc[-1], list(StepFilter.model_fields), cutoff=0.6, section='train.filter')}"
    msg = err["msg"].removeprefix("Value error, ")
    return f"{key}={given.get(loc[0], '?') if len(loc) == 1 else '?'}: {msg}" if loc else f"train.filter: {msg}"


class BatchingSection(_Section):
    strategy: Literal["episodes", "groups", "groups_var", "any_agree", "all_agree"]
    min_groups: int = Field(default=1, ge=1)
    min_episodes: int = Field(default=1, ge=1)
    agree_every: int = Field(default=0, ge=0)


class FeedbackSection(_Section):
    """Human feedback in training (docs/gateway.md "Feedback that trains"): the rating rule and corrections."""

    rating: Literal["ignore", "replace", "weighted", "fill"] = "ignore"  # how ratings combine into the reward
    rating_weight: float = Field(default=0.5, ge=0, le=1)  # weighted: (1-w) * task reward + w * rating
    rating_scale: tuple[float, float] = (0.0, 1.0)  # [min, max] of the raters' scale ...
    reward_scale: tuple[float, float] = (0.0, 1.0)  # ... mapped linearly (clamped) onto this reward range
    correction_weight: float = Field(default=1.0, ge=0)  # advantage of a correction's supervised item; 0 = off
    correction_updates: int = Field(default=1, ge=1)  # how many updates train each correction
    max_corrections: int = Field(default=8, ge=0)  # corrections per update (oldest first)

    @model_validator(mode="after")
    def _scales(self) -> FeedbackSection:
        lo, hi = self.rating_scale
        if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
            raise ValueError(f"feedback.rating_scale={[lo, hi]}: need finite [min, max] with min < max, e.g. [1, 5]")
        if not all(math.isfinite(x) for x in self.reward_scale):
            raise ValueError(f"feedback.reward_scale={list(self.reward_scale)}: need finite [min, max], e.g. [0, 1]")
        return self

    def rule(self) -> RatingRule:
        """The :class:`swarm.train.feedback.RatingRule` these keys describe."""
        from swarm.train.feedback import RatingRule

        return RatingRule(mode=self.rating, weight=self.rating_weight, rating_min=self.rating_scale[0],
                          rating_max=self.rating_scale[1], reward_min=self.reward_scale[0],
                          reward_max=self.reward_scale[1])


class MlflowSection(_Section):
    tracking_uri: str | None = None
    experiment: str = Field(default="swarmpool", min_length=1)
    sample_trajectories: int = Field(default=8, ge=0)
    nested: bool = False
    parent_run_id: str | None = None
    tags: dict[str, str] = Field(default_factory=dict)  # extra MLflow tags (flows.campaign sets swarm.campaign)


class CampaignMember(_Section):
    """``campaign_member``: set by ``flows.campaign`` on each member it runs (logged as params, searched by key)."""

    campaign: str
    key: str
    config: str = ""


class ServeConfig(_Section):
    """What ``flows.serve`` needs (conf/serve.yaml); a training run (:class:`RunConfig`) has these sections too."""

    model: Model
    pool: PoolSection
    gateway: GatewaySection = Field(default_factory=GatewaySection)
    policies: list[str] = Field(default_factory=lambda: ["default"], min_length=1)


class RunConfig(ServeConfig):
    """Everything one ``flows.train`` run needs, validated; ``raw`` keeps the resolved tree for MLflow."""

    seed: int = 0
    run_name: str | None = None
    task: TaskSection
    train: TrainSection
    batching: BatchingSection
    mlflow: MlflowSection
    algo: AlgoSection  # type: ignore[valid-type]
    runner: Runner
    feedback: FeedbackSection = Field(default_factory=FeedbackSection)
    frozen_policies: dict[str, Model] = Field(default_factory=dict)  # name -> model, served, never trained
    campaign_member: CampaignMember | None = None  # flows.campaign's label of this run
    overrides: list[str] = Field(default_factory=list)  # the command line's overrides (run name, MLflow tags)

    @model_validator(mode="after")
    def _consistent(self) -> RunConfig:
        if len(set(self.policies)) != len(self.policies):
            raise ValueError("policies: names must be unique")
        for name in self.frozen_policies:
            if name in self.policies:
                raise ValueError(f"frozen_policies.{name}: {name!r} is also in policies; a policy is either trained "
                                 "(policies) or frozen (frozen_policies), not both")
        if self.task.reward is not None:
            self.task.reward.check([*self.policies, *self.frozen_policies], self.feedback.rating)
        if self.train.filter is not None:  # a field contradicting training fails here, not at the first lease
            from swarm.loop import trainable_filter

            for policy in self.policies:
                try:
                    trainable_filter(policy, 0, self.train.max_staleness, curated=self.train.step_filter())
                except ValueError as exc:
                    raise ValueError(f"train.filter: {exc}") from None
        if self.task.group_size < 2:  # advantages are group-relative whatever algo.name (algo.group_by)
            raise ValueError(f"task.group_size={self.task.group_size}: GRPO compares the episodes of a group, "
                             "it needs at least 2")
        return self

    def raw(self) -> Tree:
        """The config as a plain dict (what MLflow logs and subprocess workers receive); no ``campaign_member``
        key outside a campaign."""
        return self.model_dump(mode="json", exclude={"campaign_member"} if self.campaign_member is None else None)


def _kinds(data: Any, key: str, where: str) -> list[tuple[str, str]]:
    """(dotted key, kind) for every string value of ``key`` in the tree: the kinds a config names, replicas included."""
    if isinstance(data, dict):
        found = [(f"{where}.{key}", data[key])] if isinstance(data.get(key), str) else []
        return found + [k for name, v in data.items() for k in _kinds(v, key, f"{where}.{name}")]
    if isinstance(data, list):
        return [k for i, v in enumerate(data) for k in _kinds(v, key, f"{where}.{i}")]
    return []


def _rebuild() -> None:
    """Make the schemas' unions hold every kind declared so far (called after each declaration)."""
    for schema in (TaskSection, ServeConfig, RunConfig, EvalConfig, _OneModel):  # holders after what they hold
        schema.model_rebuild(force=True)


def validate(resolved: Tree, overrides: list[str] | None = None, schema: type[BaseModel] | None = None,
             checks: Callable[[Any], None] | None = None) -> Any:
    """The ``schema`` (RunConfig) of a resolved config tree; raises :class:`ConfigError` with one line per problem.

    The backend and reward kinds the tree names are imported first (their modules declare them). A
    backend module may import torch (hf), so the rest of the tree is checked before, against the null
    backend, and so are ``checks`` (called with that result: the task package, the pool URL): a bad
    key or option elsewhere fails in well under a second."""
    schema = schema or RunConfig
    data = {k: v for k, v in resolved.items() if k != "hydra"}
    if overrides is not None:
        data["overrides"] = list(overrides)
    reward = data["task"].get("reward") if isinstance(data.get("task"), dict) else None
    if isinstance(reward, dict) and isinstance(reward.get("kind"), str):
        REWARDS.load([reward["kind"]], key="task.reward.kind")
    named = _kinds({k: data[k] for k in ("model", "frozen_policies") if k in data}, "backend", "")[::-1]
    if "model" in data and not all(kind in BACKENDS.kinds() for _, kind in named):
        BACKENDS.load(["echo"])
        null = {"backend": "echo"}
        frozen = data.get("frozen_policies")
        light = _check(schema, {**data, "model": null} | ({"frozen_policies": {n: null for n in frozen}}
                                                           if isinstance(frozen, dict) else {}))
        if checks is not None:
            checks(light)
        for key, kind in named:
            BACKENDS.load([kind], key=key.lstrip("."))
        return _check(schema, data)
    for key, kind in named:  # declared already: one pass reports every problem
        BACKENDS.load([kind], key=key.lstrip("."))
    run = _check(schema, data)
    if checks is not None:
        checks(run)
    return run


def _check(schema: type[BaseModel], data: Tree) -> Any:
    try:
        return schema.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(explain(exc, schema, data)) from None


class _OneModel(_Section):
    model: Model


def model_section(model: Tree) -> Any:
    """A model config (``dict``) as its backend's section; ConfigError names ``model.<key>``."""
    return validate({"model": model}, schema=_OneModel).model


# -- flows.eval ----------------------------------------------------------------------------------

EVAL_SEED = 10**15  # far above training's seed streams (seed * 10**6, Ray's (seed * 1000 + i) * 10**6, random < 2**40)


class EvalSection(_Section):
    """``eval``: which weights ``flows.eval`` evaluates (a published version or a checkpoint) and on what."""

    version: int | None = Field(default=None, ge=0)  # a published version of ``policy`` (its adapter_path)
    checkpoint: str | None = None  # or: an adapter dir (adapters/<policy>/v<N>) or a trainer checkpoint dir
    policy: str = Field(default="default", min_length=1)
    groups: int = Field(default=8, ge=1)  # prompt groups, seeds seed .. seed + groups - 1
    group_size: int | None = Field(default=None, ge=1)  # None: task.group_size
    seed: int = Field(default=EVAL_SEED, ge=0)  # the held-out instances: the same for every version
    workers: int = Field(default=4, ge=1)  # concurrent episodes

    @model_validator(mode="after")
    def _one_source(self) -> EvalSection:
        if (self.version is None) == (self.checkpoint is None):
            raise ValueError("eval: set one of eval.version=N (a published version of eval.policy) or "
                             "eval.checkpoint=DIR (an adapter or trainer checkpoint folder)"
                             + ("" if self.version is None else ", not both"))
        return self


class EvalConfig(ServeConfig):
    """What ``python -m flows.eval`` needs (conf/eval.yaml): the served model, pool, gateway, task, eval, mlflow."""

    # what a task file may set that only training reads (eval ignores them; any other key is refused)
    train: Tree | None = None
    batching: Tree | None = None
    algo: Tree | None = None
    runner: Tree | None = None

    task: TaskSection
    eval: EvalSection
    mlflow: MlflowSection = Field(default_factory=MlflowSection)

    def raw(self) -> Tree:
        """The config as a plain dict (the MLflow run's config artifact)."""
        return self.model_dump(mode="json")


BACKENDS.on_change(_rebuild)
REWARDS.on_change(_rebuild)
