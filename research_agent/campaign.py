"""The campaign planner (LLM): ``python -m research_agent.campaign "<what to compare>"``.

- plan: a description becomes ``conf/campaign/<name>.yaml``; the LLM's YAML is validated
  (:func:`research_agent.sweep.parse_campaign`, then every member's overrides are composed with
  Hydra against ``conf/train.yaml``) and sent back once with the error when invalid. ``--schedule``
  then serves it (``python -m flows.campaign +campaign=<name> --schedule``).
- propose (``--propose <name>``, also called by ``flows.campaign`` after each night with
  ``plan.propose``): reads the night's ``report.md`` / ``analysis.json`` and proposes a revised
  campaign file (same name, so the next night continues the same parent MLflow run and skips
  finished members). It is saved as ``<campaign dir>/proposals/pending.yaml`` and applied only
  with ``--auto`` or the researcher's approval (``--approve <name>``, or answering y).

It does not run members or analyse results (``flows.campaign`` / :mod:`research_agent.analysis`).
"""

from __future__ import annotations

import argparse
import difflib
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from research_agent.errors import CampaignError, LLMError, ResearchAgentError
from research_agent.llm import CONF_DIR, ChatLLM, load_agent_config, load_settings
from research_agent.sweep import CampaignSpec, campaign_dir, expand, parse_campaign

__all__ = ["plan_campaign", "propose_next", "approve", "Proposal", "check_campaign", "load_campaign_file", "main"]

PLAN_SYSTEM = """You plan training campaigns for swarmpool (RL for LLM agents). A campaign file is YAML:
name: <identifier>
description: <one line>
base: [Hydra overrides of conf/train.yaml every member gets, e.g. "+task=math", "train.updates=200"]
sweep: {mode: grid|random, params: {<override key>: [values]}, seeds: [0, 1, 2]}
concurrency: 1
budget_min: <minutes per night>
metric: reward/mean
schedule: {cron: "0 22 * * *", timezone: UTC, nights: <n>}
plan: {propose: true, auto: false}
Keys of conf/train.yaml you may sweep or set: seed, task.group_size, task.temperature, task.max_tokens,
train.updates, train.max_staleness, algo.lr, algo.kl_coef, algo.clip_low, algo.clip_high, algo.lora.rank,
algo.lora.alpha, algo.scale_std, batching.min_groups. Tasks: {tasks}.
Answer with the YAML only, in a ```yaml block."""


def _tasks(conf_dir: Path) -> str:
    return ", ".join(sorted(p.stem for p in (conf_dir / "task").glob("*.yaml"))) or "echo"


def extract_yaml(text: str) -> dict[str, Any]:
    m = re.search(r"```(?:ya?ml)?\s*\n(.*?)```", text, re.S)
    try:
        data = yaml.safe_load(m.group(1) if m else text)
    except yaml.YAMLError as exc:
        raise LLMError(f"the answer is not YAML: {exc}", raw=text) from exc
    if not isinstance(data, dict):
        raise LLMError("the answer holds no YAML mapping", raw=text)
    return data


def check_campaign(spec: CampaignSpec, conf_dir: Path) -> None:
    """Compose every member's config with Hydra; a bad key or task is a CampaignError naming it."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    with initialize_config_dir(config_dir=str(Path(conf_dir).resolve()), version_base=None):
        for m in expand(spec):
            try:
                compose(config_name="train", overrides=[*spec.base, *m.overrides, "train.out_dir=."])
            except (HydraException, OmegaConfBaseException) as exc:
                raise CampaignError(f"member {m.label}: overrides {[*spec.base, *m.overrides]} do not compose: "
                                    f"{exc}") from exc


def _ask(llm: ChatLLM, messages: list[dict[str, str]], conf_dir: Path, stage: str, name: str | None) -> CampaignSpec:
    err: Exception | None = None
    for _ in range(2):
        answer = llm.complete(messages, stage=stage)
        try:
            data = extract_yaml(answer)
            if name:
                data["name"] = name
            spec = parse_campaign(data)
            check_campaign(spec, conf_dir)
            return spec
        except (LLMError, CampaignError) as exc:
            err = exc
            messages = messages + [{"role": "assistant", "content": answer},
                                   {"role": "user", "content": f"That campaign is invalid: {exc}. Answer with the "
                                                               "corrected YAML only."}]
    raise CampaignError(f"no valid campaign after 2 answers: {err}")


def _dump(spec: CampaignSpec, header: str) -> str:
    data = spec.model_dump(mode="json", exclude_none=False)
    return f"# {header}\n" + yaml.safe_dump(data, sort_keys=False)


def load_campaign_file(name: str, conf_dir: Path | str = CONF_DIR) -> CampaignSpec:
    path = Path(conf_dir) / "campaign" / f"{name}.yaml"
    if not path.exists():
        raise CampaignError(f"{path} does not exist")
    return parse_campaign(yaml.safe_load(path.read_text()) or {})


def plan_campaign(llm: ChatLLM, description: str, conf_dir: Path | str = CONF_DIR, name: str | None = None) -> Path:
    """Write ``conf/campaign/<name>.yaml`` for ``description``; returns its path."""
    conf_dir = Path(conf_dir)
    messages = [{"role": "system", "content": PLAN_SYSTEM.replace("{tasks}", _tasks(conf_dir))},
                {"role": "user", "content": description}]
    spec = _ask(llm, messages, conf_dir, "plan", name)
    if not spec.description:
        spec = spec.model_copy(update={"description": description})
    path = conf_dir / "campaign" / f"{spec.name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(_dump(spec, f"Planned by the research agent from: {description}"))
    return path


@dataclass
class Proposal:
    path: Path          # <campaign dir>/proposals/pending.yaml (or the applied conf file)
    spec: CampaignSpec
    diff: str
    applied: bool = False


def propose_next(llm: ChatLLM, name: str, folder: Path | None = None, conf_dir: Path | str = CONF_DIR,
                 auto: bool = False) -> Proposal:
    """Read the campaign's report and propose its next revision; apply it only with ``auto``."""
    conf_dir = Path(conf_dir)
    current = load_campaign_file(name, conf_dir)
    folder = Path(folder) if folder else campaign_dir(current)
    report = folder / "report.md"
    if not report.exists():
        raise CampaignError(f"{report} does not exist: run a night first (python -m flows.campaign +campaign={name})")
    current_text = (conf_dir / "campaign" / f"{name}.yaml").read_text()
    analysis = (folder / "analysis.json").read_text()[:20000] if (folder / "analysis.json").exists() else ""
    messages = [{"role": "system", "content": PLAN_SYSTEM.replace("{tasks}", _tasks(conf_dir))},
                {"role": "user", "content": f"The campaign file:\n```yaml\n{current_text}```\n\nLast night's report:\n"
                                            f"{report.read_text()}\n\nanalysis.json:\n{analysis}\n\nPropose the next "
                                            "revision of this campaign (keep the name; members already finished are "
                                            "kept in MLflow and not rerun). Explain nothing; answer with the YAML."}]
    spec = _ask(llm, messages, conf_dir, "propose", name)
    text = _dump(spec, f"Proposed by the research agent after {time.strftime('%Y-%m-%d %H:%M')} from {report}")
    pending = folder / "proposals" / "pending.yaml"
    pending.parent.mkdir(parents=True, exist_ok=True)
    pending.write_text(text)
    (folder / "proposals" / f"proposal-{time.strftime('%Y%m%d-%H%M%S')}.yaml").write_text(text)
    diff = "".join(difflib.unified_diff(current_text.splitlines(True), text.splitlines(True),
                                        f"conf/campaign/{name}.yaml", "proposal"))
    proposal = Proposal(pending, spec, diff)
    if auto:
        proposal.path = approve(name, folder, conf_dir)
        proposal.applied = True
    return proposal


def approve(name: str, folder: Path | None = None, conf_dir: Path | str = CONF_DIR) -> Path:
    """Apply the pending proposal: the old file is kept in ``proposals/``, the new one replaces it."""
    conf_dir = Path(conf_dir)
    folder = Path(folder) if folder else campaign_dir(load_campaign_file(name, conf_dir))
    pending = folder / "proposals" / "pending.yaml"
    if not pending.exists():
        raise CampaignError(f"no pending proposal for {name} ({pending})")
    target = conf_dir / "campaign" / f"{name}.yaml"
    if target.exists():
        (folder / "proposals" / f"replaced-{time.strftime('%Y%m%d-%H%M%S')}.yaml").write_text(target.read_text())
    target.write_text(pending.read_text())
    pending.unlink()
    return target


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m research_agent.campaign", description=__doc__.split("\n")[0])
    p.add_argument("description", nargs="?", help="what the campaign should find out, in plain English")
    p.add_argument("--name", help="campaign name (default: the LLM's choice)")
    p.add_argument("--schedule", action="store_true", help="serve the planned campaign on its cron schedule")
    p.add_argument("--propose", metavar="NAME", help="propose the next revision of campaign NAME from its report")
    p.add_argument("--auto", action="store_true", help="apply the proposal without asking")
    p.add_argument("--approve", metavar="NAME", help="apply the pending proposal of campaign NAME")
    p.add_argument("--conf-dir", default=str(CONF_DIR))
    p.add_argument("--config", default="default", help="conf/research_agent/<config>.yaml")
    p.add_argument("--base-url")
    p.add_argument("--api-key")
    p.add_argument("--model")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    conf_dir = Path(args.conf_dir)
    try:
        if args.approve:
            print(f"applied: {approve(args.approve, conf_dir=conf_dir)}")
            return 0
        if not args.description and not args.propose:
            _parser().error("give a description, --propose NAME or --approve NAME")
        llm = ChatLLM(load_settings(load_agent_config(args.config, conf_dir), args.base_url, args.api_key, args.model))
        if args.propose:
            prop = propose_next(llm, args.propose, conf_dir=conf_dir, auto=args.auto)
            print(prop.diff or "(no change proposed)")
            if prop.applied:
                print(f"applied: {prop.path}")
            elif sys.stdin.isatty() and input("apply this proposal? [y/N] ").strip().lower() == "y":
                print(f"applied: {approve(args.propose, conf_dir=conf_dir)}")
            else:
                print(f"pending: {prop.path}\napply with: python -m research_agent.campaign --approve {args.propose}")
            return 0
        path = plan_campaign(llm, args.description, conf_dir, args.name)
    except ResearchAgentError as exc:
        print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
        return 2 if "No LLM" in str(exc) else 1
    name = path.stem
    print(f"wrote {path}\nrun one night now:  python -m flows.campaign +campaign={name}\n"
          f"serve it nightly:   python -m flows.campaign +campaign={name} --schedule")
    if args.schedule:
        repo = Path(__file__).resolve().parents[1]
        return subprocess.call([sys.executable, "-m", "flows.campaign", f"+campaign={name}", "--schedule"], cwd=repo)
    return 0


if __name__ == "__main__":
    sys.exit(main())
