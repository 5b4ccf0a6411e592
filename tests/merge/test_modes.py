"""Merge modes without a model: targets, parent gathers, budgets, chains, masks and stats."""

from __future__ import annotations

import pytest
import torch

from swarm.errors import ValidationError
from swarm.merge import MODES, TrainSeq, collate, merge_items, timeline_chains, tree_attention_mask
from swarm.merge.synthetic import multiturn_items, random_tree_items, werewolves_items


def _seq(name, prompt, response):
    return TrainSeq(step_id=name, prompt_ids=prompt, response_ids=response)


def _check_rows(items, batch):
    """Each target once; its predictor is its parent; positions are depths; ancestors visible."""
    seen = set()
    for row in batch.rows:
        n = len(row)
        assert len(row.position_ids) == len(row.subtree_end) == n
        for pred, tok, i, k in zip(row.predict_index, row.target_ids, row.target_item, row.target_offset, strict=False):
            assert (i, k) not in seen
            seen.add((i, k))
            item = items[i]
            depth = len(item.prompt_ids) + k
            assert tok == item.response_ids[k]
            assert row.position_ids[pred] == depth - 1
            # Walk ancestors of the predicting token: they spell the item's sequence before it.
            path, j = [], pred
            while j >= 0:
                path.append(row.input_ids[j])
                j = max((a for a in range(j) if row.subtree_end[a] > j and row.position_ids[a] == row.position_ids[j] - 1),
                        default=-1)
            assert path[::-1] == list(item.tokens[:depth])
    expected = {(i, k) for i, it in enumerate(items) for k in range(len(it.response_ids)) if len(it.prompt_ids) + k > 0}
    assert seen == expected


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("budget", [8, 32, 4096])
def test_random_trees_layout_invariants(seed, mode, budget):
    items = random_tree_items(seed, n_items=14, vocab=6 if seed % 2 else 40)
    batch = merge_items(items, mode, budget)
    _check_rows(items, batch)
    assert batch.stats.tokens_before == sum(len(it) for it in items)
    assert batch.stats.tokens_after == sum(len(r) for r in batch.rows)
    for row in batch.rows:  # only an uncuttable single path may exceed the budget
        if len(row) > budget:
            assert row.is_chain


def test_modes_savings_order_on_multiturn():
    items = multiturn_items(0, groups=2, group_size=4, turns=4)
    ratios = {m: merge_items(items, m, 4096).stats.ratio for m in MODES}
    assert ratios["none"] == 1.0
    assert 1.0 < ratios["timeline"] < ratios["tree"]
    none = merge_items(items, "none", 4096)
    assert none.stats.rows == len(items) and all(r.is_chain for r in none.rows)
    timeline = merge_items(items, "timeline", 4096)
    assert timeline.stats.rows == 8 and all(r.is_chain for r in timeline.rows)  # one row per episode


def test_timeline_chains_hand_case():
    a = _seq("a", [1, 2], [3])
    b = _seq("b", [1, 2, 3, 4], [5])
    c = _seq("c", [1, 2, 9], [8])
    d = _seq("d", [1, 2, 3], [4, 5, 6])
    chains = timeline_chains([a, b, c, d])
    assert sorted(sorted(ch) for ch in chains) == [[0, 1, 3], [2]]
    batch = merge_items([a, b, c, d], "timeline", 100)
    assert batch.stats.tokens_after == 6 + 4 and batch.stats.rows == 2


def test_tree_parent_gather_for_siblings():
    # Two responses fork after the prompt: the prompt's last token predicts both first tokens.
    items = [_seq("x", [1, 2, 3], [4, 5]), _seq("y", [1, 2, 3], [6, 7])]
    (row,) = merge_items(items, "tree", 100).rows
    assert row.input_ids == [1, 2, 3, 4, 5, 6, 7]
    assert row.position_ids == [0, 1, 2, 3, 4, 3, 4]
    firsts = [p for p, k in zip(row.predict_index, row.target_offset, strict=False) if k == 0]
    assert firsts == [2, 2]
    mask = tree_attention_mask(torch.tensor([row.subtree_end]))[0, 0]
    assert mask[5].tolist() == [True, True, True, False, False, True, False]  # 6 does not see 4, 5
    assert mask[6].tolist() == [True, True, True, False, False, True, True]


def test_oversized_tree_splits_at_node_boundary_with_repeated_context():
    system = list(range(10, 20))
    items = [_seq(f"p{p}", system + [p, p], [p + 50] * 6) for p in range(4)]
    batch = merge_items(items, "tree", token_budget=30)  # 42 tokens: two units of 10 + 2 x 8
    assert batch.stats.rows == 2 and [len(r) for r in batch.rows] == [26, 26]
    _check_rows(items, batch)
    assert batch.stats.tokens_after < batch.stats.tokens_before


def test_single_path_longer_than_budget_gets_its_own_row():
    items = [_seq("long", list(range(30)), [1, 2, 3]), _seq("short", [99], [98])]
    batch = merge_items(items, "tree", token_budget=8)
    assert sorted(len(r) for r in batch.rows) == [2, 33]
    _check_rows(items, batch)


def test_collate_fast_path_and_padding_mask():
    items = [_seq("x", [1, 2, 3], [4, 5]), _seq("y", [1, 2, 3], [6, 7]), _seq("z", [9], [8])]
    none = merge_items(items, "none", 100)
    col = collate(none.rows)
    assert col.attention_mask is None and col.position_ids is None
    tree = merge_items(items, "tree", 7, pack=False)  # the two roots cannot share a row
    col = collate(tree.rows)
    assert col.attention_mask.shape == (2, 1, 7, 7)
    short = 0 if len(tree.rows[0]) == 2 else 1
    pad_rows = col.attention_mask[short, 0, 2:]
    assert pad_rows.sum(-1).tolist() == [1] * 5  # pads see only themselves
    assert not col.attention_mask[short, 0, :2, 2:].any()  # nothing sees pads


def test_werewolves_shape_savings():
    items = werewolves_items(0, players=3, calls=5, system_len=50, role_len=5)
    none, tl, tree = (merge_items(items, m, 100_000).stats for m in MODES)
    assert tl.rows == 3 and tree.rows == 1
    assert tree.tokens_after == tl.tokens_after - 2 * 50
    assert none.tokens_before == none.tokens_after


def test_bad_mode_and_budget():
    with pytest.raises(ValidationError, match="merge mode"):
        merge_items([], "zip")
    with pytest.raises(ValidationError, match="token_budget"):
        merge_items([], "tree", 0)
    with pytest.raises(ValidationError, match="behaviour_logprobs"):
        TrainSeq(step_id="s", prompt_ids=(1,), response_ids=(2, 3), behaviour_logprobs=(-1.0,))
