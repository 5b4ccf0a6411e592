"""``python -m research_agent "<plain-English task>"``: spec -> generate -> validate -> repair -> hand over.

Options: ``--name``, ``--out`` (default experiments/), ``--conf-dir`` (default conf/),
``--max-attempts``, ``--train`` (run ``flows.train +task=<name>`` when it passes), ``--spec``
(start from an edited spec.yaml), ``--config`` (conf/research_agent/<name>.yaml) and the LLM
flags ``--base-url`` / ``--api-key`` / ``--model``. Exit code 0 when the task validates, 1 when
it does not after all attempts, 2 on a configuration problem.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

from rich.console import Console

from research_agent.errors import ResearchAgentError
from research_agent.generate import EXPERIMENTS, REPO, Target, target_for
from research_agent.llm import CONF_DIR, ChatLLM, load_agent_config, load_settings
from research_agent.repair import build_task, research_dir
from research_agent.spec import draft_spec, load_spec, save_spec
from research_agent.validate import ValidateSettings

__all__ = ["main", "train_command"]

console = Console()


def train_command(target: Target) -> tuple[list[str], dict[str, str]]:
    """The exact ``flows.train`` command line (and extra environment) that trains the task."""
    cmd = [sys.executable, "-m", "flows.train"]
    if target.conf_dir.resolve() != (REPO / "conf").resolve():
        cmd += ["--config-dir", str(target.conf_dir.resolve())]
    cmd.append(f"+task={target.name}")
    env = {} if target.import_root == REPO else {"PYTHONPATH": str(target.import_root)}
    return cmd, env


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m research_agent", description=__doc__.split("\n")[0])
    p.add_argument("description", nargs="?", help="the task, in plain English")
    p.add_argument("--name", help="task name (a lowercase identifier); default: the LLM's choice")
    p.add_argument("--out", default=str(EXPERIMENTS), help="folder for the package (default experiments/)")
    p.add_argument("--conf-dir", default=str(CONF_DIR), help="Hydra conf dir for conf/task/<name>.yaml")
    p.add_argument("--max-attempts", type=int, help="generate + repairs (default: the config's max_attempts)")
    p.add_argument("--spec", help="start from this (edited) spec.yaml instead of asking the LLM")
    p.add_argument("--train", action="store_true", help="run flows.train +task=<name> once the task validates")
    p.add_argument("--config", default="default", help="conf/research_agent/<config>.yaml")
    p.add_argument("--base-url", help="OpenAI-compatible endpoint (default $OPENAI_BASE_URL)")
    p.add_argument("--api-key", help="API key (default $OPENAI_API_KEY)")
    p.add_argument("--model", help="model name (default $RESEARCH_AGENT_MODEL)")
    p.add_argument("--policy", choices=["tiny", "echo"], help="dry-run policy (default: the config's)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if not args.description and not args.spec:
        _parser().error("give a task description, or --spec path/to/spec.yaml")
    try:
        agent_cfg = load_agent_config(args.config, args.conf_dir)
        llm = ChatLLM(load_settings(agent_cfg, args.base_url, args.api_key, args.model))
    except ResearchAgentError as exc:
        console.print(f"[red]{exc}[/red]")
        return 2
    settings = ValidateSettings.from_config(agent_cfg.get("validate"))
    if args.policy:
        settings.policy = args.policy
    attempts = int(args.max_attempts or agent_cfg.get("max_attempts", 3))
    try:
        console.rule("[bold]1. spec")
        if args.spec:
            spec = load_spec(args.spec)
            if args.name:
                spec = spec.model_copy(update={"name": args.name})
        else:
            spec = draft_spec(llm, args.description, args.name)
        target = target_for(spec, args.out, args.conf_dir)
        path = save_spec(spec, target.package_dir / "spec.yaml")
        console.print(f"{spec.name}: {spec.summary}\nreward: {spec.reward.definition}\nsaved {path} (edit it and "
                      f"rerun with --spec {path})")
        console.rule("[bold]2-4. generate, validate by running, repair")
        result = build_task(llm, spec, target, settings, attempts, log=console.print)
    except ResearchAgentError as exc:
        console.print(f"[red]{type(exc).__name__}: {exc}[/red]")
        return 1
    console.rule("[bold]5. hand over")
    console.print(f"validation reports: {research_dir(target)}/attempt-*/validation.md")
    if not result.ok:
        console.print(f"[red]the task still fails validation after {result.attempts} attempts[/red]; "
                      f"see {research_dir(target)}/attempt-{result.attempts}/validation.md")
        return 1
    cmd, env = train_command(target)
    shown = " ".join(f"{k}={v}" for k, v in env.items()) + (" " if env else "") + " ".join(["python"] + cmd[1:])
    console.print(f"[green]{spec.name} validated[/green] ({target.package_dir}, {result.config_path}).\n"
                  f"train it with:\n  {shown}")
    if args.train:
        run_env = {**os.environ, **env}
        return subprocess.call(cmd, cwd=REPO, env=run_env)
    return 0


if __name__ == "__main__":
    sys.exit(main())
