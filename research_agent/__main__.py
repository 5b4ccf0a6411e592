"""``python -m research_agent "<plain-English task>"``: spec -> generate -> validate -> repair -> hand over.

A request that a library generator or game already fits ("train it on basic arithmetic", "teach it
tic tac toe") skips all of that: :mod:`research_agent.catalog` picks it, writes ``conf/task/<name>.yaml``
for the ``reasoning_gym`` or ``textarena`` task and checks it, with no LLM and no generated code
(``--generate`` writes a new task anyway).

Options: ``--name`` (a built-in task name is refused unless ``--force``), ``--out`` (default
experiments/), ``--conf-dir`` (default conf/; searched before the repository's), ``--max-attempts``,
``--train [OVERRIDE ...]`` (run ``flows.train +task=<name>`` with these Hydra overrides when it
passes; put it last), ``--spec`` (start from an edited spec.yaml), ``--config``
(conf/research_agent/<name>.yaml) and the LLM flags ``--base-url`` / ``--api-key`` / ``--model``.
Exit code 0 when the task validates, 1 when it does not after all attempts (or the LLM failed),
2 on a configuration problem. Text from the LLM is printed as text, never as rich markup.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.text import Text

from research_agent.catalog import CatalogMatch, match_request, write_catalog_config
from research_agent.errors import ResearchAgentError, TargetError
from research_agent.generate import EXPERIMENTS, REPO, Target, target_for
from research_agent.llm import CONF_DIR, ChatLLM, load_agent_config, load_settings
from research_agent.repair import build_task, research_dir, save_transcript
from research_agent.spec import draft_spec, load_spec, save_spec
from research_agent.validate import ValidateSettings

__all__ = ["main", "train_command"]

console = Console()


def say(msg: str, style: str = "") -> None:
    """Print ``msg`` literally (LLM text may hold ``[...]``, which rich would read as markup)."""
    console.print(Text(msg, style=style), soft_wrap=True)  # long paths and commands stay copyable


def train_command(target: Target, overrides: list[str] | tuple[str, ...] = ()) -> tuple[list[str], dict[str, str]]:
    """The exact ``flows.train`` command line (and extra environment) that trains the task.

    A ``--conf-dir`` other than the repository's becomes Hydra's primary config path (searched
    first), with the repository's ``conf/`` after it for anything the user's folder lacks.
    """
    cmd = [sys.executable, "-m", "flows.train"]
    repo_conf = (REPO / "conf").resolve()
    if target.conf_dir.resolve() != repo_conf:
        cmd += ["--config-path", str(target.conf_dir.resolve()), "--config-dir", str(repo_conf)]
    cmd.append(f"+task={target.name}")
    cmd += list(overrides)
    env = {} if target.import_root == REPO else {"PYTHONPATH": str(target.import_root.resolve())}
    return cmd, env


def _overrides(values: list[str] | None) -> list[str]:
    for v in values or []:
        if "=" not in v and not v.startswith("~"):
            raise TargetError(f"--train takes Hydra overrides (key=value), got {v!r}; put the description before --train")
    return list(values or [])


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m research_agent", description=__doc__.split("\n")[0])
    p.add_argument("description", nargs="?", help="the task, in plain English")
    p.add_argument("--name", help="task name (a lowercase identifier); default: the LLM's choice")
    p.add_argument("--force", action="store_true", help="allow a built-in task name or replacing a user's task config")
    p.add_argument("--out", default=str(EXPERIMENTS), help="folder for the package (default experiments/)")
    p.add_argument("--conf-dir", default=str(CONF_DIR), help="Hydra conf dir for conf/task/<name>.yaml (searched first)")
    p.add_argument("--max-attempts", type=int, help="generate + repairs (default: the config's max_attempts)")
    p.add_argument("--spec", help="start from this (edited) spec.yaml instead of asking the LLM")
    p.add_argument("--train", nargs="*", metavar="OVERRIDE",
                   help="run flows.train +task=<name> [OVERRIDE ...] once the task validates (put it last)")
    p.add_argument("--config", default="default", help="conf/research_agent/<config>.yaml")
    p.add_argument("--base-url", help="OpenAI-compatible endpoint (default $OPENAI_BASE_URL)")
    p.add_argument("--api-key", help="API key (default $OPENAI_API_KEY)")
    p.add_argument("--model", help="model name (default $RESEARCH_AGENT_MODEL)")
    p.add_argument("--policy", choices=["tiny", "echo"], help="dry-run policy (default: the config's)")
    p.add_argument("--generate", action="store_true",
                   help="write a new task even when a library generator or game fits the description")
    return p


def _from_catalog(args: argparse.Namespace, match: CatalogMatch, conf_dir: Path, overrides: list[str]) -> int:
    """Configure the library task for ``match`` instead of generating code; check it; hand over (or train)."""
    from swarm.client.task import check_options, load_task

    name = args.name or match.generator
    console.rule("catalog: a library generator or game fits")
    say(f"{match.generator} ({match.why}): the {match.task} task runs it; no code is generated "
        "(--generate writes a new task instead)")
    try:
        path = write_catalog_config(match, name, args.description, conf_dir, args.force)
    except TargetError as exc:
        say(str(exc), "red")
        return 2
    try:
        check_options(load_task(match.task), match.task_options())
    except ValueError as exc:
        path.unlink()
        say(f"{match.generator} does not load: {exc}", "red")
        return 1
    cmd, _ = train_command(Target(EXPERIMENTS, name, conf_dir), overrides)
    say(f"{name}: {path}\ntrain it with:\n  {' '.join(['python'] + cmd[1:])}", "green")
    return subprocess.call(cmd) if args.train is not None else 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if not args.description and not args.spec:
        _parser().error("give a task description, or --spec path/to/spec.yaml")
    conf_dir = Path(args.conf_dir)
    match = None if args.spec or args.generate else match_request(args.description)
    if match is not None:
        try:
            return _from_catalog(args, match, conf_dir, _overrides(args.train))
        except TargetError as exc:
            say(str(exc), "red")
            return 2
    try:
        overrides = _overrides(args.train)
        agent_cfg = load_agent_config(args.config, conf_dir if (conf_dir / "research_agent").is_dir() else CONF_DIR)
        llm = ChatLLM(load_settings(agent_cfg, args.base_url, args.api_key, args.model))
    except ResearchAgentError as exc:
        say(str(exc), "red")
        return 2
    settings = ValidateSettings.from_config(agent_cfg.get("validate"))
    if args.policy:
        settings.policy = args.policy
    attempts = int(args.max_attempts or agent_cfg.get("max_attempts", 3))
    target: Target | None = None
    try:
        console.rule("1. spec")
        if args.spec:
            spec = load_spec(args.spec)
            if args.name:
                spec = spec.model_copy(update={"name": args.name})
        else:
            spec = draft_spec(llm, args.description, args.name)
        target = target_for(spec, args.out, conf_dir, force=args.force)
        path = save_spec(spec, target.package_dir / "spec.yaml")
        say(f"{spec.name}: {spec.summary}\nreward: {spec.reward.definition}\n"
            f"saved {path} (edit it and rerun with --spec {path})")
        console.rule("2-4. generate, validate by running, repair")
        result = build_task(llm, spec, target, settings, attempts, log=say)
    except TargetError as exc:
        say(f"{exc}", "red")
        return 2
    except ResearchAgentError as exc:
        say(f"{type(exc).__name__}: {exc}", "red")
        where = (research_dir(target) / "transcript.jsonl" if target else
                 save_transcript(llm, Path.cwd() / f"research-agent-transcript-{time.strftime('%Y%m%d-%H%M%S')}.jsonl"))
        say(f"LLM transcript: {where}")
        return 1
    console.rule("5. hand over")
    say(f"validation reports: {research_dir(target)}/attempt-*/validation.md")
    if result.isolation is not None and not result.isolation.isolated:
        say(f"WARNING: {result.isolation.describe()}", "bold red")
    if not result.ok:
        say(f"the task still fails validation after {result.attempts} attempts; "
            f"see {research_dir(target)}/attempt-{result.attempts}/validation.md "
            f"(its files under attempt-{result.attempts}/files/); nothing was installed or registered", "red")
        return 1
    no_signal = result.reports[-1].no_signal
    if no_signal:
        say(f"Note: {no_signal}.", "bold yellow")
    cmd, env = train_command(target, overrides)
    shown = " ".join(f"{k}={v}" for k, v in env.items()) + (" " if env else "") + " ".join(["python"] + cmd[1:])
    say(f"{spec.name} validated ({target.package_dir}, {result.config_path}).", "green")
    say(f"train it with:\n  {shown}")
    if args.train is not None:
        run_env = dict(os.environ)
        if env:
            run_env["PYTHONPATH"] = os.pathsep.join(p for p in (env["PYTHONPATH"], os.environ.get("PYTHONPATH")) if p)
        return subprocess.call(cmd, env=run_env)  # in the user's directory, not the repository
    return 0


if __name__ == "__main__":
    sys.exit(main())
