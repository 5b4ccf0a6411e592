"""Stage 0, catalog: a request that a library generator or game already fits picks it instead of new code.

"Train it on basic arithmetic" needs no generated package: reasoning-gym has a ``basic_arithmetic``
generator with an exact verifier, and the ``reasoning_gym`` task (experiments/reasoning_gym) runs any
of them; "teach it tic tac toe" is a TextArena game the ``textarena`` task plays. :func:`match_request`
reads the description with a deterministic rule, no LLM: a game matches when one of :data:`GAMES`'
names appears; a generator when every word of its name appears (plurals folded) or one of
:data:`PHRASES` does, the most specific match (most words) winning. Names too generic to mean a
generator on their own (:data:`AMBIGUOUS`) only match through a phrase. A library that is not
installed contributes nothing, and a request nothing fits goes on to the LLM.
:func:`write_catalog_config` writes ``conf/task/<name>.yaml``, the library task with those options.
It does not run or validate anything (the CLI checks the options with :func:`swarm.client.task.check_options`:
validated into the task's ``Options``, then its ``check()``).
"""

from __future__ import annotations

import importlib
import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path

from research_agent.errors import TargetError
from research_agent.generate import GENERATED_MARK, builtin_names

__all__ = ["PHRASES", "AMBIGUOUS", "GAMES", "CatalogMatch", "generator_names", "match_generator", "match_game",
           "match_request", "write_catalog_config", "CATALOG_TASK"]

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
# two-player TextArena games by their everyday names: (env id, opponent); random play needs listed legal moves
GAMES: dict[str, tuple[str, str]] = {
    "tic tac toe": ("TicTacToe-v0-train", "heuristic"), "tictactoe": ("TicTacToe-v0-train", "heuristic"),
    "noughts and crosses": ("TicTacToe-v0-train", "heuristic"), "othello": ("Othello-v0-train", "random"),
    "reversi": ("Othello-v0-train", "random"), "kuhn poker": ("KuhnPoker-v0-train", "random"),
    "stratego": ("Stratego-v0-train", "random"),
}
AMBIGUOUS = frozenset({"ab", "bf", "aiw", "acre", "rearc", "codeio", "composite", "products", "dice", "jugs",
                       "maze", "sudoku", "survo", "tsumego", "syllogism", "countdown"})


@dataclass(frozen=True)
class CatalogMatch:
    """A library generator or game fitting the request: its name, why, the task that runs it and its options."""

    generator: str
    why: str
    task: str = CATALOG_TASK
    options: tuple[tuple[str, str], ...] = ()  # task.options (default: {"dataset": generator})

    def task_options(self) -> dict[str, str]:
        return dict(self.options) if self.options else {"dataset": self.generator}


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


def match_game(description: str) -> CatalogMatch | None:
    """The TextArena game a request names (:data:`GAMES`), or None (also when textarena is not installed)."""
    if importlib.util.find_spec("textarena") is None:
        return None
    joined = f" {' '.join(_words(description))} "
    for phrase, (env_id, opponent) in sorted(GAMES.items(), key=lambda kv: -len(kv[0])):
        if f" {' '.join(_words(phrase))} " in joined:
            return CatalogMatch(env_id.split("-")[0].lower(), f"the request says {phrase!r}", "textarena",
                                (("env_id", env_id), ("opponent", opponent)))
    return None


def match_request(description: str) -> CatalogMatch | None:
    """A game named in the request, else a reasoning-gym generator (see the module docstring), else None."""
    return match_game(description) or match_generator(description)


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
    options = "".join(f"    {k}: {v}\n" for k, v in match.task_options().items())
    path.write_text(f"# @package _global_\n# {said!r} -> {match.generator} ({match.why}); "
                    f"experiments/{match.task}, {GENERATED_MARK} from its library catalog, no code generated.\n"
                    f"defaults:\n  - {match.task}\ntask:\n  options:\n{options}")
    return path
