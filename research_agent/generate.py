"""Stage 2, generate: a task spec becomes a task package plus ``conf/task/<name>.yaml``.

The LLM writes the package files (``__init__.py`` with ``make_instance`` / ``run_episode``,
``reward.py`` with ``compute_reward(instance, answer)``, ``README.md``, ``test_reward.py`` and an
optional small data file) in a ``<<<FILE name>>> ... <<<END>>>`` format; this module parses and
writes them. The task config is written here, not by the LLM, in the built-in tasks' shape.

A package lands in ``<out>/<name>/``. Under the repo's ``experiments/`` its module is
``experiments.<name>`` and ``task.name`` is ``<name>``; elsewhere the module is
``<out folder>.<name>`` (the folder's parent must be importable), so the package uses relative
imports only. It does not run anything (that is :mod:`research_agent.validate`).
"""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import yaml

from research_agent.errors import LLMError, TargetError
from research_agent.llm import ChatLLM
from research_agent.spec import TaskSpec

__all__ = ["TaskFiles", "Target", "Location", "target_for", "parse_files", "write_files", "write_task_config",
           "generate_files", "builtin_names", "CONTRACT", "REPO", "EXPERIMENTS", "GENERATED_MARK"]

REPO = Path(__file__).resolve().parents[1]
EXPERIMENTS = REPO / "experiments"
REQUIRED = ("__init__.py", "reward.py", "README.md", "test_reward.py")
ALLOWED_SUFFIXES = (".py", ".md", ".json", ".jsonl", ".txt", ".csv")
_FILE_RE = re.compile(r"<<<FILE\s+([^\s>]+)\s*>>>\n(.*?)\n?<<<END>>>", re.S)

CONTRACT = """A swarmpool task package is a Python package with these files:

- __init__.py: `make_instance(seed: int) -> dict` (deterministic in the seed, JSON-serialisable) and
  `run_episode(instance: dict, llm) -> dict` which talks to the policy ONLY through `llm`:
  `llm.chat(messages, **kwargs)` returns the reply message (`.content` may be None; `.tool_calls` when
  tools are passed); `llm.openai()` gives an `openai.OpenAI` client if needed, with model `llm.model`.
  `run_episode` returns `compute_reward(instance, final_answer_text)` (a dict with at least "reward").
  Export names in `__all__`. Never contact anything but `llm`; no files written, no randomness without the seed.
- reward.py: `compute_reward(instance: dict, answer: str | None) -> dict[str, float]`, pure and
  deterministic, returning {"reward": float, ...named parts as floats}; the reward lies in the spec's
  [low, high]; malformed, empty or None answers must score (never raise). Module docstring states the formula.
- when the spec's reward kind is "judge", an LLM judge gives the training reward (the task config selects it);
  compute_reward still follows the spec's definition (the answer's form only) and run_episode returns it.
- README.md: what the task is, the reward, and the exact command to train it.
- test_reward.py: plain `def test_...()` functions with asserts (no fixtures), importing with RELATIVE
  imports (`from .reward import compute_reward`, `from . import make_instance`); cover the worked examples.
- optionally one small data file (.json/.jsonl/.csv/.txt) read with `Path(__file__).parent / name`.
- __init__.py declares the task's options, always: `from swarm.client import TaskOptions` and
  `class Options(TaskOptions):` with one typed field and default per knob (sizes, a difficulty; bounds with
  `pydantic.Field(default=9, ge=1)`), or `class Options(TaskOptions): pass` when the task has no knobs. The run
  validates `task.options` into it (frozen; an unknown or mistyped key is refused, named with its path) and
  the task's code reads the values with `Options.current()` (e.g. `opts = Options.current()` in
  `make_instance`). No `configure` function and no module-level options state.
- multi-agent games (several roles that each talk to a policy, like the built-in werewolves) define
  `run_multiagent(instance: dict, client, group_id: str, cfg, kind: str = "train") -> dict` INSTEAD of
  `run_episode`: one game; for each LLM seat open an episode with
  `with client.episode(task=<task name>, group_id=group_id, type=kind) as ep:`, reach the policy with
  `openai.OpenAI(base_url=ep.base_url, api_key=ep.api_key, max_retries=0)` and model `cfg.model`
  (`max_tokens=cfg.max_tokens`), and end each with `ep.end(reward=<that seat's reward>)`; return the
  trainable side's reward parts. The task name is the package's last name component.

Use relative imports inside the package (`from .reward import compute_reward`). Standard library,
`openai`, `pydantic` (for Options' fields only) and, from swarmpool, only `swarm.client.TaskOptions`. Every
module starts with a docstring.

Answer with every file in this exact format, nothing else between files:
<<<FILE __init__.py>>>
...file content...
<<<END>>>
"""


@dataclass(frozen=True)
class Location:
    """A package folder and how to import it: ``import_root`` on sys.path makes ``module`` importable."""

    package_dir: Path
    module: str
    import_root: Path


@dataclass(frozen=True)
class Target:
    """Where a task package goes and how it is imported."""

    out: Path          # the folder holding packages
    name: str
    conf_dir: Path

    @property
    def package_dir(self) -> Path:
        return self.out / self.name

    @property
    def module(self) -> str:
        """``task.name`` in the config: ``<name>`` under experiments/, else ``<folder>.<name>``."""
        if self.out.resolve() == EXPERIMENTS.resolve():
            return self.name
        return f"{self.out.name}.{self.name}"

    @property
    def import_root(self) -> Path:
        """The sys.path entry that makes :attr:`module` importable."""
        return REPO if self.out.resolve() == EXPERIMENTS.resolve() else self.out.resolve().parent

    @property
    def config_path(self) -> Path:
        return self.conf_dir / "task" / f"{self.name}.yaml"


GENERATED_MARK = "generated by the research agent"


def builtin_names() -> set[str]:
    """Task names the repository ships (``conf/task/*.yaml`` and ``experiments/*``)."""
    names = {p.stem for p in (REPO / "conf" / "task").glob("*.yaml")}
    return names | {p.name for p in EXPERIMENTS.iterdir() if p.is_dir() and not p.name.startswith(("_", "."))}


def _import_clash(out: Path) -> str:
    """Why ``<out folder>.<name>`` would import something else, or ''."""
    import importlib.util

    if out.resolve() == EXPERIMENTS.resolve():
        return ""
    try:
        spec = importlib.util.find_spec(out.name)
    except (ImportError, ValueError):
        return ""
    if spec is None:
        return ""
    where = list(spec.submodule_search_locations or []) or [spec.origin]
    if any(Path(str(w)).resolve() == out.resolve() for w in where if w):
        return ""
    return (f"--out folder name {out.name!r} is already an importable module ({where[0]}), which would shadow the "
            f"generated package {out.name}.<name> in training; use another folder name (e.g. my_{out.name})")


def target_for(spec: TaskSpec, out: Path | str = EXPERIMENTS, conf_dir: Path | str = REPO / "conf",
               force: bool = False) -> Target:
    """The target for ``spec``; refuses built-in task names (unless ``force``) and shadowed ``--out`` folders."""
    target = Target(Path(out), spec.name, Path(conf_dir))
    clash = _import_clash(target.out)
    if clash:
        raise TargetError(clash)
    if force:
        return target
    if spec.name in builtin_names():
        raise TargetError(f"task name {spec.name!r} is a built-in task; a generated task of that name would resolve to "
                          f"(or replace) the built-in one. Choose another --name, or pass --force to replace it")
    cfg = target.config_path
    if cfg.exists() and GENERATED_MARK not in cfg.read_text():
        raise TargetError(f"{cfg} exists and was not written by the research agent; choose another --name, "
                          "or pass --force to replace it")
    return target


TaskFiles = dict[str, str]


def parse_files(text: str) -> TaskFiles:
    """``{filename: content}`` from an answer in the ``<<<FILE name>>>`` format; checks names."""
    files: TaskFiles = {}
    for name, body in _FILE_RE.findall(text):
        name = name.strip()
        if "/" in name or "\\" in name or name.startswith(".") or not name.endswith(ALLOWED_SUFFIXES):
            raise LLMError(f"file name {name!r} is not allowed (flat names ending in {', '.join(ALLOWED_SUFFIXES)})",
                           raw=text)
        files[name] = body.rstrip() + "\n"
    return files


def _example_task() -> str:
    """The built-in echo task, shown to the LLM as the shape to follow."""
    parts = []
    for rel in ("echo/__init__.py", "echo/reward.py"):
        path = EXPERIMENTS / rel
        if path.exists():
            parts.append(f"--- experiments/{rel} ---\n{path.read_text()}")
    return "\n".join(parts)


def generation_messages(spec: TaskSpec) -> list[dict[str, str]]:
    spec_yaml = yaml.safe_dump(spec.model_dump(mode="json"), sort_keys=False)
    return [
        {"role": "system", "content": "You write Python task packages for RL training of LLM agents.\n" + CONTRACT},
        {"role": "user", "content": f"Task spec:\n{spec_yaml}\nA built-in task, for shape (it uses absolute imports; "
                                    f"you must use relative ones):\n{_example_task()}\nWrite the package."},
    ]


def generate_files(llm: ChatLLM, spec: TaskSpec, attempts: int = 2) -> TaskFiles:
    """Ask the LLM for the package files; an answer without them goes back with the reason (bounded)."""
    messages = generation_messages(spec)
    err: LLMError | None = None
    for _ in range(attempts):
        answer = llm.complete(messages, stage="generate")
        try:
            files = parse_files(answer)
            missing = [f for f in REQUIRED if f not in files]
            if missing:
                raise LLMError(f"the answer lacks {', '.join(missing)} (expected <<<FILE name>>> ... <<<END>>> blocks)",
                               raw=answer)
            return files
        except LLMError as exc:
            err = exc
            messages = messages + [{"role": "assistant", "content": answer},
                                   {"role": "user", "content": f"That answer is not usable: {exc}. Answer with every "
                                                               "file in the <<<FILE name>>> format only."}]
    raise LLMError(f"no usable package after {attempts} answers: {err}")


def write_files(folder: Path, files: TaskFiles) -> list[Path]:
    """Write ``files`` into ``folder`` (a staging folder of ours), replacing whatever it held."""
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    written = []
    for name, body in files.items():
        path = folder / name
        path.write_text(body)
        written.append(path)
    return written


def write_task_config(target: Target, spec: TaskSpec) -> Path:
    """``conf/task/<name>.yaml`` in the built-in shape (``# @package _global_``, only what changes)."""
    where = f"experiments/{spec.name}" if target.module == spec.name else f"{target.out}/{spec.name}"
    judge = spec.reward.kind == "judge"  # the judge group (conf/reward/judge.yaml) with the spec's rubric
    text = (f"# @package _global_\n# {spec.summary} ({where}; {GENERATED_MARK} from spec.yaml).\n"
            + ("defaults:\n  - /reward: judge\n  - _self_\n" if judge else "")
            + f"task:\n  name: {target.module}\n  group_size: {spec.group_size}\n  max_tokens: {spec.max_tokens}\n"
            + (f"  reward:\n    rubric: {json.dumps(spec.reward.rubric.strip().replace('${', '$ {'))}\n" if judge else "")
            + "batching:\n  min_groups: 2\n")
    target.config_path.parent.mkdir(parents=True, exist_ok=True)
    target.config_path.write_text(text)
    return target.config_path
