"""Merge a batch of train items into packed rows: ``none``, ``timeline`` or ``tree``.

- ``none``: one row per item (its full prompt + response), no sharing.
- ``timeline``: items whose full sequence is a prefix of a longer item's sequence ride in that
  item's row (a multi-turn chain: turn k is a prefix of turn k+1); every earlier response is
  a trainable span inside the longest sequence. Chains never branch, so rows stay causal.
- ``tree``: all items go into one prefix trie; shared prefixes (a GRPO group's prompt, a game's
  system prompt, a conversation's history) are computed once; rows use a tree attention mask.
  Units are bin-packed into rows (first-fit decreasing) up to the token budget.

Every mode yields the same targets (one per scorable response token of every item), so losses
and gradients equal training each item alone. Stats: tokens before / after, ratio, rows.

Pure functions of token sequences. No tensors (``collate``), no model, no logging.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Literal

from swarm.errors import ValidationError
from swarm.merge.items import TrainSeq
from swarm.merge.layout import PackedRow, emit_rows, pack_units, split_tree
from swarm.merge.trie import PrefixTrie

__all__ = ["MergeMode", "MergeStats", "MergedBatch", "merge_items", "timeline_chains", "MODES"]

MergeMode = Literal["none", "timeline", "tree"]
MODES: tuple[str, ...] = ("none", "timeline", "tree")


@dataclass(frozen=True)
class MergeStats:
    """Savings of one merged batch; ``ratio`` = tokens_before / tokens_after."""

    mode: str
    items: int
    targets: int
    tokens_before: int
    tokens_after: int
    rows: int
    max_row: int

    @property
    def ratio(self) -> float:
        return self.tokens_before / self.tokens_after if self.tokens_after else 1.0

    def as_metrics(self, prefix: str = "merge/") -> dict[str, float]:
        """Slash-namespaced numbers for logging."""
        return {f"{prefix}tokens_before": float(self.tokens_before), f"{prefix}tokens_after": float(self.tokens_after),
                f"{prefix}token_ratio": float(self.ratio), f"{prefix}rows": float(self.rows),
                f"{prefix}items": float(self.items)}


@dataclass
class MergedBatch:
    """Rows to run through the model, the items they carry, and the savings."""

    items: list[TrainSeq]
    rows: list[PackedRow]
    stats: MergeStats
    token_budget: int = 0
    extra: dict = field(default_factory=dict)


def timeline_chains(items: list[TrainSeq]) -> list[list[int]]:
    """Group item indices into chains where each sequence is a prefix of the chain's longest.

    Longest first; an item joins the first chain whose head starts with it, else starts one.
    """
    order = sorted(range(len(items)), key=lambda i: -len(items[i]))
    heads: list[tuple[int, ...]] = []
    chains: list[list[int]] = []
    by_first: dict[int, list[int]] = defaultdict(list)  # first token -> chain ids (cheap filter)
    for i in order:
        seq = items[i].tokens
        n = len(seq)
        first = seq[0] if seq else -1
        for c in by_first[first]:
            if heads[c][:n] == seq:
                chains[c].append(i)
                break
        else:
            by_first[first].append(len(heads))
            heads.append(seq)
            chains.append([i])
    return chains


def merge_items(
    items: list[TrainSeq], mode: MergeMode = "tree", token_budget: int = 4096, pack: bool | None = None
) -> MergedBatch:
    """Lay ``items`` out as rows of at most ``token_budget`` tokens (see the module docstring).

    ``pack`` puts several units (independent trees or sequences) into one row; it defaults to
    True for ``tree`` and False otherwise, so ``none`` / ``timeline`` rows stay plain causal
    sequences that the trainer batches with padding.
    """
    if mode not in MODES:
        raise ValidationError(f"merge mode must be one of {MODES}, got {mode!r}")
    if token_budget < 1:
        raise ValidationError(f"token_budget must be >= 1, got {token_budget}")
    if pack is None:
        pack = mode == "tree"
    if mode == "none":
        groups = [[i] for i in range(len(items))]
    elif mode == "timeline":
        groups = timeline_chains(items)
    else:
        groups = [list(range(len(items)))] if items else []

    tries: list[PrefixTrie] = []
    targets_at: list[dict[tuple[int, int], list[tuple[int, int]]]] = []
    units = []
    for g in groups:
        trie = PrefixTrie()
        for i in g:
            trie.insert(items[i].tokens)
        tmap: dict[tuple[int, int], list[tuple[int, int]]] = defaultdict(list)
        for i in g:
            loc = trie.locate(items[i].tokens)
            p = len(items[i].prompt_ids)
            for k in range(len(items[i].response_ids)):
                if p + k > 0:  # the very first token of a sequence has no predictor
                    tmap[loc[p + k]].append((i, k))
        units.extend(split_tree(trie, len(tries), token_budget))
        tries.append(trie)
        targets_at.append(tmap)

    rows = emit_rows(tries, targets_at, pack_units(units, token_budget, pack))
    stats = MergeStats(mode=mode, items=len(items), targets=sum(len(r.target_ids) for r in rows),
                       tokens_before=sum(len(it) for it in items), tokens_after=sum(len(r) for r in rows),
                       rows=len(rows), max_row=max((len(r) for r in rows), default=0))
    return MergedBatch(items=list(items), rows=rows, stats=stats, token_budget=token_budget)
