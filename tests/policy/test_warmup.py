"""The word-chain warm-up: deterministic data, the reply format learned, the echo leak measured."""

import difflib
import random

import pytest
import torch

from swarm.policy.warmup import NOUNS, VERBS, warmup_chats


def test_chats_are_deterministic_and_read_the_last_word() -> None:
    a, b = warmup_chats(500, seed=3), warmup_chats(500, seed=3)
    assert a == b
    repeats = sum(user.split()[-1] == reply for user, reply in a)
    assert 0.1 < repeats / len(a) < 0.25  # ~repeat_p, plus chance chains
    for user, reply in a:
        last = user.split()[-1]
        assert reply == last or reply[0] == last[-1] or not [w for w in NOUNS if w[0] == last[-1] and w != last]


def test_echo_words_are_warmup_nouns() -> None:
    from experiments.echo import VERBS as ECHO_VERBS
    from experiments.echo import WORDS

    assert set(WORDS) <= set(NOUNS) and set(ECHO_VERBS) <= set(VERBS)


@pytest.mark.slow
def test_warmed_tiny_model_answers_one_word_and_rarely_echoes(warm_tiny_model_path) -> None:
    """The warm start the RL gain is measured against: one word + end token; echo rarely right."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from experiments.echo import WORDS

    tok = AutoTokenizer.from_pretrained(warm_tiny_model_path)
    model = AutoModelForCausalLM.from_pretrained(warm_tiny_model_path)
    rng, exact, ended, sim, n = random.Random(0), 0, 0, 0.0, 96
    torch.manual_seed(0)
    for _ in range(n):
        word = rng.choice(WORDS)
        prompt = tok.apply_chat_template([{"role": "user", "content": f"say {word}"}], tokenize=False,
                                         add_generation_prompt=True)
        ids = torch.tensor([tok.encode(prompt, add_special_tokens=False)])
        out = model.generate(ids, max_new_tokens=8, do_sample=True, top_k=0, pad_token_id=tok.pad_token_id)
        new = out[0, ids.shape[1]:].tolist()
        ended += tok.eos_token_id in new
        text = tok.decode(new, skip_special_tokens=True).strip()
        exact += text == word
        sim += difflib.SequenceMatcher(None, text, word).ratio()
    print(f"warm start on echo: exact {exact}/{n} ({exact / n:.1%}), ended its turn {ended}/{n}, "
          f"mean similarity {sim / n:.3f}")
    assert ended / n > 0.9  # learned to end its turn
    assert exact / n < 0.3  # the task is far from solved: room for RL
    assert sim / n < 0.6
