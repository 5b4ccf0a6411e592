"""Prefix merging of training sequences: compute every shared token once, train exactly.

Steps become :class:`TrainSeq` items; :func:`merge_items` lays them out as packed rows in one of
three modes (``none``, ``timeline``, ``tree``) with per-target gather indices, and reports the
savings in :class:`MergeStats`; :func:`collate` turns rows into model inputs with a tree
attention mask. Nothing here runs a model or computes a loss (``swarm.train`` does). The tensor
side (``tensors``, torch) is imported on first use, so modes and layouts cost no torch import.
"""

from __future__ import annotations

import importlib
from typing import Any

from swarm.merge.items import TrainSeq
from swarm.merge.layout import PackedRow
from swarm.merge.modes import MODES, MergedBatch, MergeMode, MergeStats, merge_items, timeline_chains
from swarm.merge.trie import PrefixTrie

__all__ = ["TrainSeq", "PrefixTrie", "PackedRow", "MergeMode", "MergeStats", "MergedBatch", "MODES", "merge_items",
           "timeline_chains", "Collated", "collate", "micro_batches", "tree_attention_mask"]

_LAZY = dict.fromkeys(("Collated", "collate", "micro_batches", "tree_attention_mask"), "swarm.merge.tensors")


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'swarm.merge' has no attribute {name!r}")
