"""The reasoning-gym side of the adapter: options, the lazy library import and seeded items per split.

An item is one entry of a reasoning-gym generator (``{"question", "answer", "metadata"}``). Nearly
every generator draws entry ``idx`` from ``random.Random(dataset.seed + idx)``, so the adapter keeps
two generator instances per option set whose seed ranges cannot meet: the training split draws from
``[0, 2**31)`` and the held-out eval split from ``[2**31, 2**32)`` (some generators seed numpy, which
takes seeds below 2**32). A worker seed picks the index ``seed % len(dataset)`` in its split.
A few generators build their whole dataset up front (:data:`PREBUILT`) or cap its size; they keep
their own size, and their two splits are two datasets built from the two split seeds. Small
generators can still repeat a question text under two seeds (there are only so many one-digit sums);
the seeds themselves never overlap.

This module does not talk to a model or score replies (see :mod:`experiments.reasoning_gym.reward`).
"""

from __future__ import annotations

import functools
import importlib
import json
from types import ModuleType
from typing import Any

from pydantic import Field, ValidationInfo, field_validator

from swarm.client import TaskOptions
from swarm.client.options import import_optional

__all__ = ["PIP_HINT", "SPLITS", "PREBUILT", "Options", "library", "generator_names", "item", "split_seed"]

PIP_HINT = "pip install 'swarmpool[envs]' (or: pip install reasoning-gym==0.1.25)"
SPLITS = ("train", "eval")
_INDEX_SPAN = 2**31  # entry seeds per split; the eval split's start here, past every training seed
PREBUILT = frozenset({"acre", "gsm_symbolic", "list_functions"})  # build `size` entries up front: 2**31 of them would not fit in memory


def library() -> ModuleType:
    """``reasoning_gym``, imported on first use; ImportError naming the pip command when it is absent."""
    return import_optional("reasoning_gym", f"the reasoning_gym task needs the reasoning-gym library: {PIP_HINT}")


def generator_names() -> list[str]:
    """Every generator name reasoning-gym registers (``task.options.dataset`` takes one of them)."""
    library()
    return sorted(importlib.import_module("reasoning_gym.factory").DATASETS)


class Options(TaskOptions):
    """Task options (``task.options``); the README lists each key."""

    dataset: str = Field(default="basic_arithmetic", min_length=1)  # a generator name, e.g. basic_arithmetic
    config: dict[str, dict[str, Any]] = Field(default_factory=dict)  # generator -> its config fields (not seed/size)
    system_prompt: str = ""   # "" none; a key of reasoning_gym.utils.SYSTEM_PROMPTS ("direct", ...); or the text
    answer_tags: bool = False  # True: only an <answer>...</answer> span is scored; False: else the whole reply

    @field_validator("config")
    @classmethod
    def _no_seed_or_size(cls, config: dict[str, dict[str, Any]], info: ValidationInfo) -> dict[str, dict[str, Any]]:
        if {"seed", "size"} & set(config.get(info.data.get("dataset", ""), {})):
            raise ValueError("must not set seed or size (the adapter seeds items; the worker's seed picks the entry)")
        return config

    def check(self) -> None:
        """The library imports and the generator accepts its config (an unknown name or a refused config fails)."""
        item(self, 0, "train")

    def generator_config(self) -> dict[str, Any]:
        """The chosen generator's config fields (``config[dataset]``; none: the generator's defaults)."""
        return dict(self.config.get(self.dataset) or {})

    def key(self) -> str:
        """A hashable identity of the generator settings (the dataset cache key)."""
        return json.dumps([self.dataset, self.generator_config()], sort_keys=True, default=str)

    def prompt_text(self) -> str:
        """The system prompt to send ('' for none): a named reasoning-gym prompt or the literal text."""
        if not self.system_prompt:
            return ""
        named = importlib.import_module("reasoning_gym.utils").SYSTEM_PROMPTS
        return named.get(self.system_prompt, self.system_prompt)


def _base(split: str) -> int:
    if split not in SPLITS:
        raise ValueError(f"reasoning_gym: split {split!r}; use one of {SPLITS}")
    return _INDEX_SPAN if split == "eval" else 0


def split_seed(options: Options, seed: int, split: str) -> int:
    """The reasoning-gym entry seed (``dataset.seed + idx``) a worker seed maps to in ``split``."""
    return _base(split) + int(seed) % len(_dataset(options.key(), split))


@functools.lru_cache(maxsize=32)
def _dataset(key: str, split: str) -> Any:
    name, config = json.loads(key)
    lib = library()
    if name not in importlib.import_module("reasoning_gym.factory").DATASETS:
        raise ValueError(f"reasoning_gym: no generator {name!r}; known: {', '.join(generator_names())}")
    sized = {} if name in PREBUILT else {"size": _INDEX_SPAN}
    try:
        try:
            return lib.create_dataset(name, seed=_base(split), **sized, **config)
        except (AssertionError, ValueError) as exc:
            if not sized or "size" not in str(exc).lower():
                raise
            return lib.create_dataset(name, seed=_base(split), **config)  # a generator that caps its size (word_ladder)
    except (TypeError, AssertionError, ValueError) as exc:  # reasoning-gym validates its configs with asserts
        raise ValueError(f"reasoning_gym: generator {name!r} refuses config {config!r}: {exc}") from None


def item(options: Options, seed: int, split: str = "train") -> tuple[dict[str, Any], Any]:
    """(entry, dataset) for a worker seed in ``split``: the dataset scores replies to the entry."""
    dataset = _dataset(options.key(), split)
    return dataset[int(seed) % len(dataset)], dataset
