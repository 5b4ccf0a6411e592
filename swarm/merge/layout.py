"""Lay tries out as packed rows: depth-first token order, tree attention, per-target gathers.

A :class:`PackedRow` is one model input row holding one or more (sub)trees laid out
depth-first. Every token carries its position id (its depth in the trie) and the exclusive end
of its subtree inside the row, which defines the tree attention mask: token ``i`` attends to
token ``j`` iff ``j <= i < subtree_end[j]`` (``j`` is an ancestor of ``i``, or ``i`` itself).
A row whose tokens form one path is a plain causal sequence (``is_chain``).

Every trainable target (response token ``k`` of item ``t``) records ``predict_index``: the
packed index of the token whose output predicts it, i.e. its *parent* in the trie. In a
branching row that is generally not ``i - 1``: the last token of a node predicts the first
token of each of its children.

Splitting: a tree larger than the token budget is cut at node boundaries. Children of an
oversized node are grouped (first-fit decreasing) into units that each repeat the path from
the root as context; a child that alone does not fit recurses. A single path (one node chain)
longer than the budget is never cut, because each token needs all its ancestors: it gets a row
of its own that exceeds the budget (so does every path below a context that alone fills it). Repeated context tokens are computed again, so they count
in ``tokens_after``, but each target is emitted exactly once, in the first row that holds its
token, so losses and gradients are unchanged.

Pure Python; no tensors here (see ``collate``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from swarm.merge.trie import ROOT, PrefixTrie

__all__ = ["PackedRow", "Unit", "split_tree", "pack_units", "emit_rows"]


@dataclass
class PackedRow:
    """One model input row; target lists are parallel (one entry per trainable token)."""

    input_ids: list[int] = field(default_factory=list)
    position_ids: list[int] = field(default_factory=list)
    subtree_end: list[int] = field(default_factory=list)
    predict_index: list[int] = field(default_factory=list)
    target_ids: list[int] = field(default_factory=list)
    target_item: list[int] = field(default_factory=list)
    target_offset: list[int] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.input_ids)

    @property
    def is_chain(self) -> bool:
        """True when the row is one causal sequence from position 0 (no mask needed)."""
        n = len(self.input_ids)
        return all(p == i for i, p in enumerate(self.position_ids)) and all(e == n for e in self.subtree_end)


@dataclass(frozen=True)
class Unit:
    """A piece of one trie that goes into one row: a context path and whole subtrees under it."""

    trie: int  # index of the trie in the caller's list
    context: tuple[int, ...]  # node ids from the root down (repeated in every unit under them)
    subtrees: tuple[int, ...]
    cost: int  # tokens it occupies in a row


def split_tree(trie: PrefixTrie, trie_index: int, budget: int, sizes: list[int] | None = None) -> list[Unit]:
    """Cut one trie into units of at most ``budget`` tokens where a node boundary allows."""
    sizes = sizes if sizes is not None else trie.subtree_sizes()
    units: list[Unit] = []
    # Work list of (node, context path, context tokens); iterative to survive deep tries.
    work: list[tuple[int, tuple[int, ...], int]] = [(ROOT, (), 0)]
    while work:
        node, ctx, ctx_len = work.pop()
        kids = [trie.children[node][k] for k in sorted(trie.children[node])]
        own = len(trie.tokens[node])
        if ctx_len + sizes[node] <= budget or not kids:
            # Fits, or cannot be cut (a leaf: one path, needed whole).
            if sizes[node] > 0:
                units.append(Unit(trie_index, ctx, (node,), ctx_len + sizes[node]))
            continue
        ctx2, len2 = ctx + (node,), ctx_len + own
        cap = budget - len2  # <= 0: every child recurses, down to single paths if need be
        fitting = [c for c in kids if sizes[c] <= cap]
        for c in kids:
            if sizes[c] > cap:
                work.append((c, ctx2, len2))
        for group in _first_fit_decreasing(fitting, [sizes[c] for c in fitting], cap):
            units.append(Unit(trie_index, ctx2, tuple(group), len2 + sum(sizes[c] for c in group)))
    return units


def pack_units(units: list[Unit], budget: int, pack: bool) -> list[list[Unit]]:
    """Group units into rows: first-fit decreasing to ``budget`` when ``pack``, else one per row."""
    if not pack:
        return [[u] for u in units]
    return _first_fit_decreasing(units, [u.cost for u in units], budget)


def _first_fit_decreasing(things: list, costs: list[int], cap: int) -> list[list]:
    order = sorted(range(len(things)), key=lambda i: -costs[i])
    bins: list[list] = []
    room: list[int] = []
    for i in order:
        for b, r in enumerate(room):
            if costs[i] <= r:
                bins[b].append(things[i])
                room[b] -= costs[i]
                break
        else:
            bins.append([things[i]])
            room.append(cap - costs[i])
    return bins


def emit_rows(
    tries: list[PrefixTrie],
    targets_at: list[dict[tuple[int, int], list[tuple[int, int]]]],
    rows_of_units: list[list[Unit]],
) -> list[PackedRow]:
    """Materialise rows. ``targets_at[t][(node, offset)]`` lists ``(item, k)`` targets on that token."""
    sizes = [t.subtree_sizes() for t in tries]
    emitted: set[tuple[int, int, int]] = set()
    rows = []
    for units in rows_of_units:
        row = PackedRow()
        for u in units:
            _emit_unit(row, tries[u.trie], sizes[u.trie], targets_at[u.trie], u, emitted)
        rows.append(row)
    return rows


def _emit_unit(row: PackedRow, trie: PrefixTrie, sizes: list[int], targets_at, unit: Unit, emitted: set) -> None:
    start = len(row.input_ids)
    unit_end = start + unit.cost
    where: dict[tuple[int, int], int] = {}  # (node, offset) -> packed index in this row

    def place(node: int, end: int) -> None:
        for o, tok in enumerate(trie.tokens[node]):
            idx = len(row.input_ids)
            where[(node, o)] = idx
            row.input_ids.append(tok)
            row.position_ids.append(trie.depth[node] + o)
            row.subtree_end.append(end)
            key = (unit.trie, node, o)
            if key in emitted:
                continue  # repeated context: its targets were emitted in an earlier row
            emitted.add(key)
            tgts = targets_at.get((node, o))
            if not tgts:
                continue
            if o > 0:
                pred = where[(node, o - 1)]
            else:
                parent = trie.parent[node]
                pred = where[(parent, len(trie.tokens[parent]) - 1)]
            for item, k in tgts:
                row.predict_index.append(pred)
                row.target_ids.append(tok)
                row.target_item.append(item)
                row.target_offset.append(k)

    for node in unit.context:
        place(node, unit_end)
    for sub in unit.subtrees:
        for node in trie.preorder(sub):
            place(node, len(row.input_ids) + sizes[node])
    assert len(row.input_ids) == unit_end, "unit cost does not match its layout"
