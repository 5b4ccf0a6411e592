"""Block-sparse tree attention equals the dense tree mask (logprobs and gradients), any block size."""

from __future__ import annotations

import pytest
from tiny_llama import make_tiny_llama

from swarm.merge import collate, merge_items
from swarm.merge.synthetic import multiturn_items, random_tree_items
from swarm.train import target_logprobs
from swarm.train.tree_attention import block_plan


@pytest.mark.parametrize("block", [1, 4, 16, 1000])
def test_block_sparse_matches_dense(block):
    items = random_tree_items(5, n_items=16, vocab=10) + multiturn_items(4)
    batch = merge_items(items, "tree", 64)
    col = collate(batch.rows, force_mask=True)
    model = make_tiny_llama(seed=6)
    dense, _ = target_logprobs(model, col, block_size=None)
    dense.sum().backward()
    g_dense = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    sparse, _ = target_logprobs(model, col, block_size=block)
    sparse.sum().backward()
    assert ((sparse - dense).abs() / dense.abs()).max() < 1e-5
    for n, p in model.named_parameters():
        assert ((p.grad - g_dense[n]).abs().max() / g_dense[n].abs().max()) < 1e-5, n
    assert model.config._attn_implementation == "sdpa"  # switched back after the forward


def test_plan_skips_unseen_blocks():
    # Two 8-token branches under a 4-token prompt: with blocks of 4, the second branch's
    # queries never need the first branch's keys.
    items = [{"p": list(range(4)), "r": list(range(10, 18))}, {"p": list(range(4)), "r": list(range(20, 28))}]
    from swarm.merge import TrainSeq

    seqs = [TrainSeq(str(i), it["p"], it["r"]) for i, it in enumerate(items)]
    col = collate(merge_items(seqs, "tree", 100).rows)
    plan = block_plan(col.attention_mask, 4)
    (row,) = plan.rows
    q0, q1, idx, sub = row[-1]  # last block of the second branch
    assert (q0, q1) == (16, 20)
    assert idx.tolist() == [0, 1, 2, 3, 12, 13, 14, 15, 16, 17, 18, 19]
    assert sub.shape == (1, 1, 4, 12)
