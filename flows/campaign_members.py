"""A campaign's members as ``flows.train`` configs: composing, overrides, identity, run names.

:func:`compose_config` composes ``train.yaml`` with the user's ``--config-dir`` searched before the
repository's ``conf/``; :func:`plan_members` composes each member's full config, hashes it
(:func:`research_agent.sweep.config_hash`) and gives it a folder, an MLflow run name and tags.
It runs nothing (``flows/campaign.py`` does).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydra import compose, version
from omegaconf import OmegaConf

from flows.config import Tree
from research_agent.sweep import MEMBER_DIR, CampaignSpec, Member, campaign_dir, config_hash, parse_campaign, run_label

__all__ = ["MemberPlan", "compose_config", "load_campaign", "member_overrides", "plan_members", "config_flags", "CONF"]

REPO = Path(__file__).resolve().parents[1]
CONF = REPO / "conf"


@dataclass(frozen=True)
class MemberPlan:
    """A member with its effective-config hash, its folder, MLflow run name, tags and ``train.updates``."""

    member: Member
    hash: str
    folder: Path
    run_name: str
    tags: dict[str, str]
    updates: int = 0


@contextlib.contextmanager
def _search_path(conf_dir: Path | str | None) -> Iterator[None]:
    """Hydra's search path for composing: ``conf_dir`` first (when given), then the repository's ``conf/``.

    The same order as ``python -m flows.train --config-path DIR --config-dir <repo>/conf`` (Hydra's own
    ``--config-dir`` is searched after the primary path, so it could not override a built-in file).
    """
    from hydra._internal.hydra import Hydra
    from hydra._internal.utils import create_config_search_path
    from hydra.core.config_search_path import SearchPathQuery
    from hydra.initialize import get_gh_backup, restore_gh_from_backup

    backup = get_gh_backup()
    version.setbase(None)
    first = Path(conf_dir).resolve() if conf_dir else CONF
    csp = create_config_search_path(str(first))
    if first != CONF:
        csp.prepend(provider="command-line", path=f"file://{CONF}", anchor=SearchPathQuery(provider="schema"))
    Hydra.create_main_hydra2(task_name="campaign", config_search_path=csp)
    try:
        yield
    finally:
        restore_gh_from_backup(backup)


def compose_config(overrides: list[str], conf_dir: Path | str | None = None) -> Any:
    """``train.yaml`` composed with ``overrides`` (unresolved DictConfig), ``conf_dir`` searched before ``conf/``."""
    with _search_path(conf_dir):
        return compose(config_name="train", overrides=overrides)


def load_campaign(name: str, overrides: list[str],
                  conf_dir: Path | str | None) -> tuple[CampaignSpec, Tree, Path]:
    """The campaign's typed spec (``campaign.*`` overrides applied), its MLflow section and its folder."""
    forced = [f"++{o}" if o.startswith("campaign.") else o for o in overrides]  # any campaign key, set or not
    cfg = compose_config([f"+campaign={name}", *forced, "train.out_dir=."], conf_dir)
    spec = parse_campaign(OmegaConf.to_container(cfg.campaign, resolve=True))  # type: ignore[arg-type]
    out = campaign_dir(spec)
    return spec, OmegaConf.to_container(cfg.mlflow, resolve=True), out  # type: ignore[return-value]


def member_overrides(spec: CampaignSpec, m: Member, user: list[str], folder: Path | str,
                     run_name: str | None = None) -> list[str]:
    """The overrides that make member ``m`` a ``flows.train`` config writing under ``folder``."""
    name = (run_name or f"{spec.name} {m.label}").replace("'", "")
    return [*spec.base, *user, *m.overrides, f"train.out_dir={folder}",
            f"run_name='{name}'", f"++campaign_member.campaign={spec.name}",
            f"++campaign_member.key={m.key}", f"++campaign_member.config='{m.config_label}'"]


def plan_members(spec: CampaignSpec, members: list[Member], user: list[str], out: Path,
                 conf_dir: Path | str | None = None) -> list[MemberPlan]:
    """Compose each member's full config to hash it (:func:`config_hash`) and name its run and folder."""
    plans = []
    for m in members:
        cfg = OmegaConf.to_container(compose_config(member_overrides(spec, m, user, MEMBER_DIR), conf_dir),
                                     resolve=True)
        assert isinstance(cfg, dict)
        h = config_hash(cfg)
        task, model = str(cfg["task"]["name"]), str(cfg["model"].get("path") or cfg["model"].get("name"))
        plans.append(MemberPlan(m, h, out / "members" / f"{m.key}-{h[:8]}", run_label(task, m),
                                {"swarm.task": task, "swarm.model": model, "swarm.campaign": spec.name,
                                 "swarm.kind": "member", "swarm.member_hash": h}, int(cfg["train"]["updates"])))
    return plans


def config_flags(conf_dir: Path | None) -> list[str]:
    """``flows.train`` flags for the same search path as :func:`compose_config` (user's folder first)."""
    if conf_dir is None or conf_dir.resolve() == CONF:
        return []
    return ["--config-path", str(conf_dir.resolve()), "--config-dir", str(CONF)]
