"""A tiny random Llama (hidden 32, 2 layers) shared by the merge and trainer tests; one CPU thread."""

from __future__ import annotations

import torch

torch.set_num_threads(1)


def make_tiny_llama(seed: int = 0, vocab: int = 100, hidden: int = 32):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        initializer_range=0.08,
    )
    return LlamaForCausalLM(cfg)
