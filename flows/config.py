"""The typed run config of ``flows.train`` and ``flows.serve``: the composed Hydra tree, validated once.

Light on purpose (pydantic, the standard library and torch-free swarm modules only): a bad value or
a mistyped key in any group fails here with one line naming the key (and the close one), in well
under a second, before Prefect, MLflow or torch are imported. Every group is a section that forbids
unknown keys: ``model`` (and each ``frozen_policies`` entry, and each fleet replica) is a union on
``backend``, ``runner`` a union on ``kind``; ``algo`` holds :class:`~swarm.train.TrainConfig`'s fields
(defaults from there) plus the advantage settings and one :class:`~swarm.train.LoraSpec`; ``gateway``
holds :class:`~swarm.web.settings.GatewaySettings`' non-secret fields (``None``: its default).
Building objects from the sections is :mod:`flows.components`' job, not this module's.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import types
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, Union, get_args, get_origin, get_type_hints

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model, model_serializer, model_validator

from swarm.errors import ConfigError
from swarm.train.config import TrainConfig

if TYPE_CHECKING:
    from swarm.train.feedback import RatingRule

Tree = dict[str, Any]  # a resolved Hydra tree, or part of one: untyped until validate() types it

__all__ = ["ConfigError", "RunConfig", "ServeConfig", "RewardSection", "TaskSection", "TrainSection", "BatchingSection",
           "MlflowSection", "AlgoSection", "PoolSection", "GatewaySection", "HFModel", "VLLMModel", "UpstreamModel",
           "EchoModel", "FleetModel", "Model", "ThreadRunner", "ProcessRunner", "RayRunner", "Runner", "validate",
           "model_section", "section_keys", "check_pool_url", "check_task", "unknown_key_hint", "workers_elsewhere", "make_train_config",
           "FeedbackSection", "EvalSection", "EvalConfig", "EVAL_SEED"]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class _Model(_Section):
    name: str | None = None  # a label (MLflow's swarm.model tag; a fleet replica's name)
    capacity: float = Field(default=1.0, gt=0)  # as a fleet replica: its share of the requests
    tool_parser: str | None = None


class _Weights(_Model):
    path: str | None = None  # the trainer's base weights (HF id or folder; hf: also what is served)
    dtype: str = "float32"  # of the base weights; auto: flows.components.model_dtype
    device: str = "cpu"


class HFModel(_Weights):
    """``backend: hf``: transformers in this process; no ``path`` and no ``gguf``: the tiny model built here."""

    backend: Literal["hf"]
    gguf: str | None = None  # a packaged model's name or a .gguf file (swarm/policy/gguf.py)
    warmup: Literal["word_chain", "reading", "none"] | None = None  # the tiny model's warm-up
    seed: int = 0
    tiny_spec: dict[str, int] = Field(default_factory=dict)  # TinySpec overrides (checked when built)
    max_batch_size: int = Field(default=16, ge=1)
    batch_wait_ms: float = Field(default=5, ge=0)
    torch_threads: int | None = None
    chat_template: str | None = None
    attn_implementation: str | None = None
    merge_lora: bool | None = None  # decode a one-policy batch on a copy with its LoRA merged; None: on for CUDA
    static_cache_len: int | None = Field(default=None, ge=2)  # decode on max_batch_size static slots of this length
    compile_step: bool | None = None  # torch.compile the static decode step (CUDA graphs); None: on for CUDA

    @model_validator(mode="after")
    def _one_source(self) -> HFModel:
        if self.path and self.gguf:
            raise ValueError(f"model.path={self.path} and model.gguf={self.gguf} are both set; keep one")
        return self


class VLLMModel(_Weights):
    """``backend: vllm``: a ``vllm serve`` process; ``path`` / ``dtype``: the trainer's copy of the base."""

    backend: Literal["vllm"]
    base_url: str
    model: str
    tokenizer_path: str | None = None
    adapter_dir: str | None = None
    max_context: int | None = None
    chat_template: str | None = None
    timeout_s: float = 600.0


class UpstreamModel(_Model):
    """``backend: upstream``: any OpenAI-compatible server, frozen (the api key comes from ``api_key_env``)."""

    backend: Literal["upstream"]
    base_url: str
    model: str | None = None
    api_key_env: str | None = "SWARM_UPSTREAM_API_KEY"
    tokenizer_path: str | None = None
    completions: bool = False
    max_tokens: int = 4096
    max_stop: int = 4
    max_context: int = 32768
    logprobs: bool = True
    max_top_logprobs: int = 20
    timeout_s: float = 300.0
    extra_body: Tree | None = None  # passed through to the upstream API as JSON


class EchoModel(_Model):
    """``backend: echo``: the null backend (benchmarks, fast tests)."""

    backend: Literal["echo"]
    reply: str | None = None
    max_context: int = 4096
    delay_s: float = 0.0
    family: str | None = None


Replica = Annotated[Union[HFModel, VLLMModel, UpstreamModel, EchoModel], Field(discriminator="backend")]  # noqa: UP007


class FleetModel(_Weights):
    """``backend: fleet``: replicas (model sections, no fleets) behind one backend (docs/scale_out.md)."""

    backend: Literal["fleet"]
    replicas: list[Replica] = Field(min_length=1)
    wait_s: float = 120.0
    cooldown_s: float = 5.0
    retries: int = 1


Model = Annotated[Union[HFModel, VLLMModel, UpstreamModel, EchoModel, FleetModel],  # noqa: UP007
                  Field(discriminator="backend")]


class PoolSection(_Section):
    url: str  # sqlite:///file.db or postgresql+psycopg://...; $SWARM_POOL_URL wins (flows.components.make_pool)
    block_size: int = Field(default=64, ge=1)

    @model_validator(mode="after")
    def _scheme(self) -> PoolSection:
        if (scheme := self.url.split(":", 1)[0].split("+", 1)[0]) not in ("sqlite", "postgresql"):
            raise ValueError(f"pool.url={self.url}: unsupported database {scheme!r}; use sqlite:///path/pool.db or "
                             "postgresql+psycopg://user@host:5432/db")
        return self


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


class GatewaySection(_Section):
    """``gateway``: where it listens, and GatewaySettings' non-secret fields (None: GatewaySettings' default)."""

    host: str = "127.0.0.1"
    port: int = Field(default=8420, ge=0, le=65535)  # 0: a free port
    log_level: Literal["critical", "error", "warning", "info", "debug", "trace"] = "warning"  # uvicorn's
    follow_versions_s: float = Field(default=0.0, ge=0)  # > 0: load the pool's newer policy versions this often
    base_url: str | None = None
    max_body_bytes: _Pos | None = None
    max_whitebox_body_bytes: _Pos | None = None
    max_tokens_cap: _Pos | None = None
    max_n: _Pos | None = None
    default_max_tokens: _Pos | None = None
    default_episode_timeout_s: _Secs | None = None
    max_episode_timeout_s: _Secs | None = None
    sweep_interval_s: _Secs | None = None
    timeout_keep_alive_s: _Secs | None = None
    timeout_request_head_s: _Secs | None = None
    timeout_request_body_s: _Secs | None = None
    limit_concurrency: _Pos | None = None
    max_connections: _Pos | None = None
    max_connections_per_client: _Pos | None = None
    max_request_head_bytes: _Pos | None = None
    allowed_hosts: tuple[Annotated[str, Field(min_length=1)], ...] | None = None
    reward_authority: dict[str, Literal["agent", "judge", "admin"]] | None = None  # task -> lowest reward source

    def settings(self) -> Any:
        """GatewaySettings from these keys and the SWARM_* secrets in the environment (imports the gateway)."""
        from swarm.web.settings import GatewaySettings

        skip = {"host", "port", "log_level", "follow_versions_s"}
        return GatewaySettings.from_env(**{k: v for k, v in self.model_dump(exclude=skip).items() if v is not None})


class RewardSection(_Section):
    """``task.reward``: where the episodes' rewards come from (conf/reward/judge.yaml, docs/judge.md).

    ``kind: task`` (the default, no block): the task package's own reward. ``kind: judge``: an LLM
    judge scores complete groups (:class:`swarm.judge.JudgeSpec` checks the values; None: its default).
    """

    kind: Literal["task", "judge"] = "task"
    policy: str = "judge"
    rubric: str | None = None
    scale: list[int] | None = None  # [min, max]
    view: Literal["final", "transcript"] | None = None
    chunk_size: int | None = None
    max_tokens: int | None = None
    max_chars: int | None = None
    retries: int | None = None
    weights: dict[str, float] | None = None  # {judge: w, task: w}
    timeout_s: float | None = None
    concurrency: int | None = None
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
    seeded: bool = False  # each call carries a sampling seed of (instance seed, group member, call) (WorkerConfig.seeded)
    options: Tree = Field(default_factory=dict)  # the task's own schema (its Options) checks them
    reward: RewardSection | None = None  # None: the task's own reward

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
    return f"{key}={_value(given, tuple(err['loc']))}: {msg}" if loc else f"train.filter: {msg}"


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


class ServeConfig(_Section):
    """What ``flows.serve`` needs (conf/serve.yaml); a training run (:class:`RunConfig`) has these sections too."""

    model: Model
    pool: PoolSection
    gateway: GatewaySection = Field(default_factory=GatewaySection)
    policies: list[str] = Field(default_factory=lambda: ["default"], min_length=1)


class RunConfig(ServeConfig):
    """Everything one ``flows.train`` run needs, validated; ``raw`` keeps the resolved tree for MLflow."""

    model_config = ConfigDict(extra="allow", frozen=True)  # tasks may add top-level keys of their own

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
    overrides: list[str] = Field(default_factory=list)  # the command line's overrides (run name, MLflow tags)

    @model_validator(mode="after")
    def _consistent(self) -> RunConfig:
        if len(set(self.policies)) != len(self.policies):
            raise ValueError("policies: names must be unique")
        for name in self.frozen_policies:
            if name in self.policies:
                raise ValueError(f"frozen_policies.{name}: {name!r} is also in policies; a policy is either trained "
                                 "(policies) or frozen (frozen_policies), not both")
        judge = self.task.reward
        if judge is not None and judge.kind == "judge" and judge.policy not in (*self.policies, *self.frozen_policies):
            raise ValueError(f"task.reward.policy={judge.policy!r}: no such policy; serve a judge with "
                             f"+model@frozen_policies.{judge.policy}=tiny (or =upstream), or name one of "
                             f"{[*self.policies, *self.frozen_policies]}")
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

    @model_validator(mode="after")
    def _feedback_fits(self) -> RunConfig:
        judge = self.task.reward
        if self.feedback.rating == "fill" and judge is not None and judge.kind == "judge":
            raise ValueError("feedback.rating=fill with task.reward.kind=judge: the judge's reward arrives after an "
                             "episode ends, and fill would set a rated episode's reward before it; use "
                             "feedback.rating=weighted or replace with a judge")
        return self

    def raw(self) -> Tree:
        """The config as a plain dict (what MLflow logs and subprocess workers receive)."""
        return self.model_dump(mode="json")


def _judge_wiring(data: Tree) -> Tree:
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


def _members(tp: Any) -> list[Any]:
    """The types a field may hold: Annotated, Optional and unions unwrapped."""
    if get_origin(tp) is Annotated:
        return _members(get_args(tp)[0])
    if get_origin(tp) in (Union, types.UnionType):
        return [m for a in get_args(tp) for m in _members(a)]
    return [tp]


def _fields(tp: Any) -> Tree:
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return {n: f.annotation for n, f in tp.model_fields.items()}
    return get_type_hints(tp) if dataclasses.is_dataclass(tp) else {}


def _tag(tp: Any) -> Any:
    """A union member's discriminator value (its one-value Literal field), None if it has none."""
    for ann in _fields(tp).values():
        if get_origin(ann) is Literal and len(get_args(ann)) == 1:
            return get_args(ann)[0]
    return None


def _walk(schema: type, loc: tuple[Any, ...]) -> tuple[list[Any], list[str], list[Any]]:
    """(an error location's key path without union tags, the names its section allows, the types it may hold)."""
    path: list[Any] = []
    known: list[str] = []
    cur = [schema]
    for part in loc:
        if len(cur) > 1 and (tagged := [t for t in cur if _tag(t) == part]):
            cur = tagged
            continue
        path.append(part)
        fields = {n: a for t in cur for n, a in _fields(t).items()}
        if fields:
            known, cur = list(fields), _members(fields.get(part, Any))
        else:  # dict[str, X] / list[X]: the part is a key or an index
            known, cur = [], [m for t in cur for m in _members(get_args(t)[-1] if get_args(t) else Any)]
    return path, known, cur


def section_keys(key: str, schema: type = RunConfig) -> list[str]:
    """The names allowed beside dotted ``key`` in its section (a union's: every member's); [] in an open dict."""
    return _walk(schema, tuple(key.split(".")))[1]


def validate(resolved: Tree, overrides: list[str] | None = None, schema: type[BaseModel] = RunConfig) -> Any:
    """The ``schema`` (RunConfig) of a resolved config tree; raises :class:`ConfigError` with one line per problem."""
    data = _judge_wiring({k: v for k, v in resolved.items() if k != "hydra"})
    if overrides is not None:
        data["overrides"] = list(overrides)
    try:
        return schema.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_lines(exc, schema, data)) from None


class _OneModel(_Section):
    model: Model


def model_section(model: Tree) -> Any:
    """A model config (``dict``) as its :data:`Model` section; ConfigError names ``model.<key>``."""
    return validate({"model": model}, schema=_OneModel).model


def _lines(exc: ValidationError, schema: type, data: Tree) -> str:
    lines = []
    for err in exc.errors():
        path, known, types_ = _walk(schema, err["loc"])
        key = ".".join(str(p) for p in path)
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] in ("extra_forbidden", "unexpected_keyword_argument"):
            section = key.rpartition(".")[0]
            lines.append(f"{key}: unknown key{unknown_key_hint(str(path[-1]), known, cutoff=0.6, section=section)}")
        elif err["type"] in ("union_tag_not_found", "union_tag_invalid"):
            field = err["ctx"]["discriminator"].strip("'")
            tags = [t for t in map(_tag, types_) if t]
            got = _value(data, (*path, field))
            lines.append(f"{key}.{field}{'' if got == '?' else '=' + str(got)}: "
                         f"{'missing' if got == '?' else 'unknown'}; use one of {', '.join(tags)}")
        elif err["type"] == "missing":
            lines.append(f"{key}: missing (set {key}=...)")
        elif key and msg.startswith((key + ".", key + ":", f"{path[-1]}.")):  # the message names its key already
            lines.append(msg if msg.startswith(key) else f"{key.rpartition('.')[0]}.{msg}")
        elif key:
            lines.append(f"{key}={_value(data, tuple(path))}: {msg}")
        else:
            lines.append(msg)
    return "; ".join(lines)


def _value(data: Tree, loc: tuple[Any, ...]) -> Any:
    cur: Any = data
    for p in loc:
        try:
            cur = cur[p]
        except (KeyError, IndexError, TypeError):
            return "?"
    return cur


def unknown_key_hint(key: str, known: list[str], *, cutoff: float = 0.75, section: str = "") -> str:
    """`` (did you mean train.updates?)`` for a mistyped ``key`` among ``known``, '' if none is close.

    ``key`` and ``known`` are dotted keys; or, with ``section``, the names inside that section (the
    suggestion is then spelled ``section.name``).
    """
    close = difflib.get_close_matches(key, known, n=1, cutoff=cutoff)
    return f" (did you mean {section + '.' if section else ''}{close[0]}?)" if close else ""


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

    model_config = ConfigDict(extra="allow", frozen=True)  # a task file may set keys only training reads

    task: TaskSection
    eval: EvalSection
    mlflow: MlflowSection = Field(default_factory=MlflowSection)

    def raw(self) -> Tree:
        """The config as a plain dict (the MLflow run's config artifact)."""
        return self.model_dump(mode="json")

