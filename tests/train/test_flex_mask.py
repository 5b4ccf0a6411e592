"""Flex attention's tree mask: mask_mod and BlockMask equal the dense tree mask; the CPU forward matches dense; CPU training is refused."""

from __future__ import annotations

import pytest
import torch
from tiny_llama import make_tiny_llama
from torch.nn.attention.flex_attention import create_block_mask, create_mask, flex_attention

from swarm.errors import ValidationError
from swarm.merge import TrainSeq, collate, merge_items, tree_attention_mask
from swarm.merge.synthetic import multiturn_items, random_tree_items, werewolves_items
from swarm.train import TrainConfig, Trainer, target_logprobs
from swarm.train.flex_mask import tree_block_mask, tree_mask_mod, use_flex_attention


def _batches() -> list[tuple[list[TrainSeq], int]]:
    return [
        (random_tree_items(5, n_items=16, vocab=10) + multiturn_items(4), 64),
        (werewolves_items(0, players=3, calls=4, system_len=60), 4096),
        (multiturn_items(2), 300),
    ]


def _collated(items: list[TrainSeq], budget: int, rows: int = 3):
    batch = merge_items(items, "tree", budget)
    return collate(batch.rows[:rows], force_mask=True)


@pytest.mark.parametrize("case", range(3))
@pytest.mark.parametrize("block", [16, 128])
def test_mask_mod_and_block_mask_equal_dense(case, block):
    col = _collated(*_batches()[case])
    end = col.subtree_end
    b, length = end.shape
    dense = tree_attention_mask(end)
    assert torch.equal(dense, col.attention_mask)
    assert torch.equal(create_mask(tree_mask_mod(end, block), b, None, length, length), dense)
    ours = tree_block_mask(end, block)
    ref = create_block_mask(tree_mask_mod(end, block), b, None, length, length, device="cpu", BLOCK_SIZE=block)
    assert ours.shape == ref.shape
    for field in ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices", "q_num_blocks",
                  "full_q_num_blocks"):
        assert torch.equal(getattr(ours, field), getattr(ref, field)), field
    assert torch.equal(ours.to_dense(), ref.to_dense())


def test_block_mask_marks_full_blocks():
    # a 256-token shared prompt then two 200-token branches: the branches' query blocks see the
    # prompt's key blocks whole (full: no mask_mod there), and never the other branch
    seqs = [TrainSeq(str(i), list(range(256)), list(range(1000 * (i + 1), 1000 * (i + 1) + 200))) for i in range(2)]
    col = collate(merge_items(seqs, "tree", 2000).rows)
    length = col.subtree_end.shape[1]
    bm = tree_block_mask(col.subtree_end)
    assert int(bm.full_kv_num_blocks.sum()) > 0
    ref = create_block_mask(tree_mask_mod(col.subtree_end), 1, None, length, length, device="cpu")
    assert torch.equal(bm.full_kv_num_blocks, ref.full_kv_num_blocks)
    assert torch.equal(bm.to_dense(), ref.to_dense())


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_flex_kernel_matches_sdpa_on_tree_mask():
    col = _collated(*_batches()[1])
    end = col.subtree_end
    b, length = end.shape
    torch.manual_seed(0)
    q, k, v = (torch.randn(b, 4, length, 16) for _ in range(3))
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=col.attention_mask)
    out = flex_attention(q, k, v, block_mask=tree_block_mask(end))  # eager flex: CPU, no grad
    assert (out - ref).abs().max() < 1e-5


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_flex_forward_equals_dense_on_cpu(monkeypatch):
    """The model's own flex path with our BlockMask (eager flex kernel: CPU forward, no grad)."""
    import transformers.integrations.flex_attention as hf_flex

    def eager_flex(query, key, value, training=False, **kwargs):
        return flex_attention(query, key, value, **kwargs)

    monkeypatch.setattr(hf_flex, "compile_friendly_flex_attention", eager_flex)  # skip a ~30 s CPU compile
    items = random_tree_items(5, n_items=16, vocab=10) + multiturn_items(4)
    rows = merge_items(items, "tree", 64).rows
    dense_col, flex_col = collate(rows, force_mask=True), collate(rows, force_mask=True, dense_mask=False)
    assert flex_col.attention_mask is None and flex_col.subtree_end is not None
    model = make_tiny_llama(seed=3)
    with torch.no_grad():
        dense, _ = target_logprobs(model, dense_col)
        sdpa_on_demand, _ = target_logprobs(model, flex_col)  # no dense mask collated: built from the tree
        use_flex_attention(model)
        assert model.config._attn_implementation == "flex_attention"
        flex, _ = target_logprobs(model, flex_col)
    assert torch.equal(sdpa_on_demand, dense)
    assert (flex - dense).abs().max() < 1e-4


def test_flex_training_refused_on_cpu():
    model = make_tiny_llama(seed=1)
    with pytest.raises(ValidationError, match="train.attention='flex' needs a CUDA device"):
        Trainer(model, TrainConfig(lora=None, attention="flex"))
    use_flex_attention(model)
    col = _collated(*_batches()[0])
    with pytest.raises(ValidationError, match="no backward"):
        target_logprobs(model, col)


def test_attention_config_is_validated():
    with pytest.raises(ValidationError, match="train.attention"):
        TrainConfig(attention="sparse")  # type: ignore[arg-type]
