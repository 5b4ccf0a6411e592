"""A campaign's definition and its members: the typed form of ``conf/campaign/<name>.yaml``.

A campaign sweeps Hydra overrides of ``flows.train`` over a grid or random samples, each
configuration with several seeds; every (configuration, seed) is one member with a stable key
(a hash of its swept values: its label and folder name). Whether a member is already done is
decided by :func:`config_hash`, a hash of its whole effective config (base config, campaign base
overrides, command-line overrides and swept values), so changing ``train.updates`` or
``conf/train.yaml`` reruns it.

It does not run anything (``flows/campaign.py`` does) and never imports Hydra or MLflow.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from research_agent.errors import CampaignError

__all__ = ["CampaignSpec", "SweepSpec", "ScheduleSpec", "PlanSpec", "DecisionSpec", "EarlyStopSpec", "Member", "expand",
           "parse_campaign", "format_value", "campaign_dir", "config_hash", "run_label", "config_label", "match_config",
           "baseline_label", "rule_text", "VOLATILE_KEYS", "MEMBER_DIR"]

# Config keys that differ between runs of the same member without changing what is trained: where
# it writes and which MLflow run it is (see :func:`config_hash`).
VOLATILE_KEYS = ("run_name", "mlflow", "campaign_member", "hydra", "gateway.port")
# The placeholder ``train.out_dir`` a member's config is hashed with (so ``pool.url`` under it is stable).
MEMBER_DIR = "@member_dir"


class _M(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Range(_M):
    low: float
    high: float
    log: bool = False
    integer: bool = False


class SweepSpec(_M):
    mode: Literal["grid", "random"] = "grid"
    params: dict[str, list[Any] | Range] = Field(default_factory=dict)   # override key -> values or a range
    samples: int = Field(default=4, ge=1)      # random mode: configurations drawn
    sampler_seed: int = 0                      # random mode: same draws every night
    seeds: list[int] = Field(default_factory=lambda: [0])

    @model_validator(mode="after")
    def _check(self) -> SweepSpec:
        for k, v in self.params.items():
            if isinstance(v, Range) and self.mode == "grid":
                raise ValueError(f"sweep.params.{k}: a range needs sweep.mode=random (grid takes a list of values)")
            if isinstance(v, list) and not v:
                raise ValueError(f"sweep.params.{k}: give at least one value")
        if not self.seeds:
            raise ValueError("sweep.seeds: give at least one seed")
        return self


class ScheduleSpec(_M):
    cron: str = "0 22 * * *"                   # nightly at 22:00
    timezone: str = "UTC"
    nights: int = Field(default=3, ge=1)       # a scheduled night after this many does nothing


class PlanSpec(_M):
    propose: bool = False                      # after each night, ask the LLM planner for the next campaign
    auto: bool = False                         # apply its proposal without approval


class DecisionSpec(_M):
    """The decision the campaign is for, written before any run: adopt ``adopt`` if the metric gains at least
    ``min_gain`` over the baseline with the interval above 0."""

    adopt: dict[str, Any]                      # the candidate's swept values, e.g. {algo.lora.rank: 32}
    min_gain: float = 0.0                      # in the metric's units (win rate 0.03 = 3 points)
    rule: str = ""                             # the rule in words; "" = written from the fields (:func:`rule_text`)


class EarlyStopSpec(_M):
    """Stop configurations that are clearly behind at a checkpoint (members pause at each ``at`` update)."""

    rule: Literal["halving", "behind"] = "halving"  # halving: keep the best ``keep`` fraction; behind: interval < 0
    at: list[int] = Field(min_length=1)        # updates at which configurations are compared
    keep: float = Field(default=0.5, gt=0, le=1)

    @field_validator("at")
    @classmethod
    def _at(cls, v: list[int]) -> list[int]:
        if any(x < 1 for x in v):
            raise ValueError(f"early_stop.at={v}: updates start at 1")
        return sorted(set(v))


class CampaignSpec(_M):
    name: str
    description: str = ""
    base: list[str] = Field(default_factory=list)   # overrides every member gets, e.g. ["+task=math"]
    sweep: SweepSpec = Field(default_factory=SweepSpec)
    concurrency: int = Field(default=1, ge=1)        # >1 runs members as `python -m flows.train` processes
    budget_min: float | None = Field(default=None, gt=0)   # per night; no member starts after it
    metric: str = "auto"        # auto: eval/win | eval/reward where members run held-out eval groups, else reward/mean
    out_dir: str | None = None                       # default experiments/campaigns/<name>
    schedule: ScheduleSpec = Field(default_factory=ScheduleSpec)
    plan: PlanSpec = Field(default_factory=PlanSpec)
    question: str = ""                               # what the campaign should find out, in words
    baseline: dict[str, Any] | None = None           # swept values of the baseline; None = the first configuration
    decision: DecisionSpec | None = None
    confidence: float = Field(default=0.95, gt=0.5, lt=1)  # of the intervals over seeds
    early_stop: EarlyStopSpec | None = None
    notes: str = ""                                  # a proposal's reason (cites the last report's answer)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not v.replace("_", "").replace("-", "").isalnum():
            raise ValueError(f"name {v!r}: use letters, digits, _ and -")
        return v

    @model_validator(mode="after")
    def _named_configs(self) -> CampaignSpec:
        for where, values in (("baseline", self.baseline), ("decision.adopt", self.decision and self.decision.adopt)):
            for k, v in (values or {}).items():
                if k not in self.sweep.params:
                    raise ValueError(f"{where}.{k}: not a swept key; swept: {', '.join(self.sweep.params) or 'none'}")
                grid = self.sweep.params[k]
                if isinstance(grid, list) and format_value(v) not in [format_value(x) for x in grid]:
                    raise ValueError(f"{where}.{k}={format_value(v)}: not among the swept values {grid}")
        if self.decision and self.baseline is not None and self.decision.adopt == self.baseline:
            raise ValueError("decision.adopt: the candidate is the baseline itself; name another configuration")
        return self


def parse_campaign(data: dict[str, Any]) -> CampaignSpec:
    """Validate a campaign dict; the error names the key and the fix."""
    try:
        return CampaignSpec.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(f"campaign.{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors())
        raise CampaignError(f"invalid campaign: {problems} (see conf/campaign/tiny_lr.yaml)") from exc


def format_value(v: Any) -> str:
    """A value as a Hydra override right-hand side."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return repr(v)
    if v is None:
        return "null"
    if isinstance(v, list | dict):
        import json

        return json.dumps(v).replace('"', "")
    return str(v)


@dataclass(frozen=True)
class Member:
    values: dict[str, Any]          # swept key -> value
    seed: int
    overrides: tuple[str, ...] = field(default=())

    @property
    def config_label(self) -> str:
        return config_label(self.values)

    @property
    def label(self) -> str:
        return f"{self.config_label},seed={self.seed}"

    @property
    def key(self) -> str:
        return "m-" + hashlib.sha1(self.label.encode()).hexdigest()[:10]


def config_hash(cfg: dict[str, Any]) -> str:
    """sha256 of the canonical JSON of a resolved member config, less :data:`VOLATILE_KEYS`.

    Compose the config with ``train.out_dir=`` :data:`MEMBER_DIR` so paths under the member's folder
    (the pool file) hash the same wherever the campaign writes.
    """
    clean = json.loads(json.dumps(cfg, default=str))
    for dotted in VOLATILE_KEYS:
        *parents, last = dotted.split(".")
        node = clean
        for k in parents:
            node = node.get(k) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node.pop(last, None)
    canonical = json.dumps(clean, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(canonical.encode()).hexdigest()


def run_label(task: str, m: Member) -> str:
    """A member's MLflow run name: the task and its overrides, keys shortened to their last part when
    that stays unambiguous (``echo lr=0.001 seed=0``)."""
    lasts = [k.rsplit(".", 1)[-1] for k in m.values]
    short = len(set(lasts)) == len(lasts) and "seed" not in lasts
    parts = [f"{k.rsplit('.', 1)[-1] if short else k}={format_value(v)}" for k, v in m.values.items()]
    return " ".join([task.rsplit(".", 1)[-1], *parts, f"seed={m.seed}"])


def _draw(rng: random.Random, v: list[Any] | Range) -> Any:
    if isinstance(v, list):
        return rng.choice(v)
    if v.log:
        x = math.exp(rng.uniform(math.log(v.low), math.log(v.high)))
    else:
        x = rng.uniform(v.low, v.high)
    return int(round(x)) if v.integer else float(f"{x:.4g}")


def expand(spec: CampaignSpec) -> list[Member]:
    """All members, configurations in order, each with every seed (deterministic)."""
    keys = list(spec.sweep.params)
    if spec.sweep.mode == "grid":
        grids = [spec.sweep.params[k] for k in keys]
        configs = [dict(zip(keys, combo, strict=True)) for combo in itertools.product(*grids)]  # type: ignore[arg-type]
    else:
        rng = random.Random(spec.sweep.sampler_seed)
        configs = []
        for _ in range(spec.sweep.samples):
            configs.append({k: _draw(rng, spec.sweep.params[k]) for k in keys})
    members = []
    seen = set()
    for values in configs:
        for seed in spec.sweep.seeds:
            m = Member(values, seed, tuple(f"{k}={format_value(v)}" for k, v in values.items()) + (f"seed={seed}",))
            if m.key not in seen:
                seen.add(m.key)
                members.append(m)
    return members


def config_label(values: dict[str, Any]) -> str:
    """A configuration's label from its swept values, as members and reports name it (``algo.lr=0.001``)."""
    return ",".join(f"{k}={format_value(v)}" for k, v in values.items()) or "base"


def match_config(spec: CampaignSpec, values: dict[str, Any], where: str = "config") -> str:
    """The label of the one configuration of the sweep whose swept values include ``values``."""
    configs = {m.config_label: m.values for m in expand(spec)}
    hits = [label for label, vs in configs.items()
            if all(format_value(vs.get(k)) == format_value(v) for k, v in values.items())]
    if len(hits) != 1:
        raise CampaignError(f"campaign {spec.name}: {where} {values} matches {len(hits)} configurations "
                            f"(need exactly one); configurations: {', '.join(configs)}")
    return hits[0]


def baseline_label(spec: CampaignSpec) -> str:
    """The baseline's label: ``baseline`` when given, else the first configuration of the sweep."""
    if spec.baseline:
        return match_config(spec, spec.baseline, "baseline")
    first = expand(spec)
    return first[0].config_label if first else "base"


def rule_text(spec: CampaignSpec, metric: str) -> str:
    """The decision rule in words: the researcher's ``decision.rule`` or one written from its fields."""
    d = spec.decision
    if d is None:
        return ""
    if d.rule:
        return d.rule
    return (f"adopt {match_config(spec, d.adopt, 'decision.adopt')} if {metric} gains >= {d.min_gain:g} over {baseline_label(spec)} "
            f"with the {spec.confidence:.0%} interval above 0")


def campaign_dir(spec: CampaignSpec) -> Path:
    """Where a campaign's members, report and proposals go: ``out_dir`` or ``experiments/campaigns/<name>``."""
    return Path(spec.out_dir) if spec.out_dir else Path(__file__).resolve().parents[1] / "experiments" / "campaigns" / spec.name
