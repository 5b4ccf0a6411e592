"""The Prefix merging view's numbers: what prefix merging saves on a batch or a group.

A batch is one lease (the steps a trainer took for one update: the lease index finds them);
a group is a ``group_id``. Its steps' exact token sequences go through the same
:func:`swarm.merge.merge_items` the trainer uses, in every mode, for tokens before / after and
the saving; and into one :class:`swarm.merge.PrefixTrie` for the tree view: each node is a
run of tokens, with how many sequences pass through it (shared spans have more than one) and
how many of its tokens are trainable (a response token of some step).

The sequences come from the pool (:meth:`swarm.pool.Overview.sequences`: the lease / group index and
the content-addressed blocks); nothing here reads the database. It does not train or log.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from swarm.dashboard.svg import PALETTE
from swarm.merge import MODES, PrefixTrie, TrainSeq, merge_items

__all__ = ["merge_summary", "tree_view", "icicle_svg", "MAX_STEPS"]

MAX_STEPS = 512  # a batch or group larger than this is shown by its first MAX_STEPS steps


def merge_summary(seqs: list[dict[str, Any]], token_budget: int = 4096) -> dict[str, Any]:
    """Tokens before / after and the saving (%) of merging ``seqs`` in every merge mode."""
    items = [TrainSeq(step_id=s["step_id"], prompt_ids=s["prompt_ids"], response_ids=s["response_ids"]) for s in seqs]
    budget = max([token_budget] + [len(it) for it in items])
    out: dict[str, Any] = {"steps": len(items)}
    for mode in MODES:
        st = merge_items(items, mode=mode, token_budget=budget).stats
        out[mode] = {"tokens_before": st.tokens_before, "tokens_after": st.tokens_after, "rows": st.rows,
                     "saving_pct": round(100.0 * (1 - st.tokens_after / st.tokens_before), 2) if st.tokens_before
                     else 0.0, "ratio": round(st.ratio, 3)}
    return out


def tree_view(seqs: list[dict[str, Any]], decode: Callable[[str, list[int]], str] | None = None,
              max_nodes: int = 400) -> dict[str, Any]:
    """The prefix trie of ``seqs``: nodes in depth-first order with their sharing and text."""
    trie = PrefixTrie()
    for s in seqs:
        trie.insert(s["prompt_ids"] + s["response_ids"])
    n_seqs = [0] * len(trie)
    trainable: list[set[int]] = [set() for _ in range(len(trie))]
    for s in seqs:
        loc = trie.locate(s["prompt_ids"] + s["response_ids"])
        p = len(s["prompt_ids"])
        for node in {n for n, _ in loc}:
            n_seqs[node] += 1
        for node, off in loc[p:]:
            trainable[node].add(off)
    order = trie.preorder()
    level = {0: 0}
    nodes = []
    policy = seqs[0]["policy"] if seqs else "default"
    for node in order[1:]:
        level[node] = level[trie.parent[node]] + 1
        if len(nodes) < max_nodes:
            toks = list(trie.tokens[node])
            text = None
            if decode is not None:
                try:
                    text = decode(policy, toks[:64])
                except Exception:  # a backend that cannot decode (or another tokenizer): ids only
                    text = None
            nodes.append({"id": node, "parent": trie.parent[node], "level": level[node], "start": trie.depth[node],
                          "tokens": len(toks), "sequences": n_seqs[node], "trainable": len(trainable[node]),
                          "text": text, "ids_head": toks[:16]})
    shared = sum(len(trie.tokens[n]) for n in order[1:] if n_seqs[n] > 1)
    return {"nodes": nodes, "n_nodes": len(trie) - 1, "truncated": len(trie) - 1 > max_nodes,
            "tokens_in_tree": trie.n_tokens, "shared_tokens": shared,
            "svg": icicle_svg(trie, n_seqs, max(1, len(seqs)))}


def icicle_svg(trie: PrefixTrie, n_seqs: list[int], total: int, width: int = 860, height: int = 260,
               max_nodes: int = 3000) -> str:
    """The trie as an icicle: x = token position, band height = sequences through the node."""
    from swarm.dashboard.svg import _esc

    depth_end = [trie.depth[n] + len(trie.tokens[n]) for n in range(len(trie))]
    max_pos = max(depth_end) or 1
    sx = (width - 20) / max_pos
    unit = (height - 20) / total
    y0 = {0: 10.0}
    cursor = {0: 10.0}
    rects = []
    for node in trie.preorder()[1:]:
        p = trie.parent[node]
        y = cursor[p]
        cursor[p] = y + n_seqs[node] * unit
        y0[node] = cursor[node] = y
        if len(rects) >= max_nodes:
            continue
        x = 10 + trie.depth[node] * sx
        w = max(1.0, len(trie.tokens[node]) * sx)
        h = max(1.0, n_seqs[node] * unit - 1)
        col = PALETTE[0] if n_seqs[node] > 1 else PALETTE[1]
        rects.append(f'<rect x="{x:.1f}" y="{y:.1f}" width="{w:.1f}" height="{h:.1f}" fill="{col}" '
                     f'fill-opacity="0.85" stroke="#fff" stroke-width="0.5"><title>node {node}: tokens '
                     f'{trie.depth[node]}..{depth_end[node] - 1} ({len(trie.tokens[node])}), shared by '
                     f'{n_seqs[node]} sequence(s)</title></rect>')
    legend = (f'<rect x="10" y="{height - 8}" width="9" height="8" fill="{PALETTE[0]}"/>'
              f'<text x="22" y="{height}" font-size="10">shared span</text>'
              f'<rect x="100" y="{height - 8}" width="9" height="8" fill="{PALETTE[1]}"/>'
              f'<text x="112" y="{height}" font-size="10">one sequence only</text>'
              f'<text x="{width - 10}" y="{height}" font-size="10" text-anchor="end">token position 0..{max_pos}'
              f'</text>')
    return (f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height + 4}" width="100%" '
            f'class="chart" role="img" aria-label="{_esc("prefix tree")}">' + "".join(rects) + legend + "</svg>")
