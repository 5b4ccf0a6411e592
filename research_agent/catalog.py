"""Stage 0, catalog: a request that a library generator already fits picks it instead of new code.

"Train it on basic arithmetic" needs no generated package: reasoning-gym has a ``basic_arithmetic``
generator with an exact verifier, and the ``reasoning_gym`` task (experiments/reasoning_gym) runs any
of them. :func:`match_generator` reads the description with a deterministic rule, no LLM: a
generator matches when every word of its name appears in the description (plurals folded), or when
one of :data:`PHRASES` does; the most specific match (most name words) wins. Names too generic to
mean a generator on their own (:data:`AMBIGUOUS`) only match through a phrase. Without reasoning-gym
installed the catalog is empty and every request goes on to the LLM. :func:`write_catalog_config`
writes ``conf/task/<name>.yaml``, the reasoning_gym task with that generator. It does not run or
validate anything (the CLI checks the options through the task's own ``check_options``).
"""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass
from pathlib import Path

from research_agent.errors import TargetError
from research_agent.generate import GENERATED_MARK, builtin_names

__all__ = ["PHRASES", "AMBIGUOUS", "CatalogMatch", "generator_names", "match_generator", "write_catalog_config",
           "CATALOG_TASK"]

CATALOG_TASK = "reasoning_gym"
# everyday wordings of a generator whose name a request would not use
PHRASES: dict[str, str] = {
    "arithmetic": "basic_arithmetic", "add and subtract": "basic_arithmetic", "multiplication": "products",
    "multiply": "products", "times table": "products", "spell backward": "spell_backward",
    "spelling backward": "spell_backward", "reverse a word": "spell_backward", "sort number": "number_sorting",
    "sort word": "word_sorting", "count letter": "letter_counting", "greatest common divisor": "gcd",
    "least common multiple": "lcm", "prime factor": "prime_factorization", "n queen": "n_queens",
    "tower of hanoi": "tower_of_hanoi", "game of life": "game_of_life", "caesar cipher": "caesar_cipher",
    "24 game": "puzzle24", "knights and knave": "knights_knaves", "family relationship": "family_relationships",
}
AMBIGUOUS = frozenset({"ab", "bf", "aiw", "acre", "rearc", "codeio", "composite", "products", "dice", "jugs",
                       "maze", "sudoku", "survo", "tsumego", "syllogism", "countdown"})


@dataclass(frozen=True)
class CatalogMatch:
    """A library generator fitting the request: the task that runs it and why it was picked."""

    generator: str
    why: str
    task: str = CATALOG_TASK


def generator_names() -> list[str]:
    """reasoning-gym's generator names, or [] when the library is not installed."""
    try:
        return sorted(importlib.import_module("reasoning_gym.factory").DATASETS)
    except ModuleNotFoundError:
        return []


def _words(text: str) -> list[str]:
    return [w[:-1] if len(w) > 3 and w.endswith("s") and not w.endswith("ss") else w
            for w in re.findall(r"[a-z0-9]+", text.lower())]


def match_generator(description: str, names: list[str] | None = None) -> CatalogMatch | None:
    """The generator a plain-English request names (see the module docstring), or None."""
    names = generator_names() if names is None else names
    if not names:
        return None
    words = _words(description)
    joined = f" {' '.join(words)} "
    best: tuple[int, str, str] | None = None
    for name in names:
        parts = _words(name.replace("_", " "))
        if len(parts) == 1 and (name in AMBIGUOUS or len(name) < 4):
            continue
        if all(p in words for p in parts):
            best = max(best or (0, "", ""), (len(parts), name, f"the request names every word of {name!r}"))
    for phrase, name in PHRASES.items():
        if name in names and f" {' '.join(_words(phrase))} " in joined:
            best = max(best or (0, "", ""), (len(phrase.split()), name, f"the request says {phrase!r}"))
    return CatalogMatch(best[1], best[2]) if best else None


def write_catalog_config(match: CatalogMatch, name: str, description: str, conf_dir: Path,
                         force: bool = False) -> Path:
    """``<conf_dir>/task/<name>.yaml``: the catalog task with the matched generator (refuses clashes like generate)."""
    path = Path(conf_dir) / "task" / f"{name}.yaml"
    if not force and name in builtin_names():
        raise TargetError(f"task name {name!r} is a built-in task; choose another --name, or pass --force")
    if not force and path.exists() and GENERATED_MARK not in path.read_text():
        raise TargetError(f"{path} exists and was not written by the research agent; choose another --name, "
                          "or pass --force to replace it")
    said = " ".join(description.split())[:100].replace("#", "")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"# @package _global_\n# {said!r} -> reasoning-gym generator {match.generator} ({match.why}); "
                    f"experiments/{match.task}, {GENERATED_MARK} from its library catalog, no code generated.\n"
                    f"defaults:\n  - {match.task}\ntask:\n  options:\n    dataset: {match.generator}\n")
    return path
