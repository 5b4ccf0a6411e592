"""The compressed prefix trie: sharing, splits only on divergence, locate, subtree sizes."""

from __future__ import annotations

import random

from swarm.merge.trie import ROOT, PrefixTrie


def test_shared_prefix_stored_once_and_split_on_divergence():
    t = PrefixTrie()
    t.insert([1, 2, 3, 4])
    t.insert([1, 2, 5])
    assert t.n_tokens == 5  # 1 2 | 3 4 | 5
    (a,) = t.children[ROOT].values()
    assert t.tokens[a] == (1, 2)
    assert sorted(t.tokens[c] for c in t.children[a].values()) == [(3, 4), (5,)]
    assert t.subtree_sizes()[a] == 5


def test_prefix_insert_does_not_split():
    t = PrefixTrie()
    t.insert([7, 8, 9, 10])
    t.insert([7, 8])
    assert len(t) == 2 and t.n_tokens == 4
    assert t.locate([7, 8]) == [(1, 0), (1, 1)]


def test_locate_after_later_splits_and_depths():
    rng = random.Random(0)
    seqs = [[rng.randrange(4) for _ in range(rng.randint(1, 12))] for _ in range(60)]
    t = PrefixTrie()
    for s in seqs:
        t.insert(s)
    for s in seqs:
        loc = t.locate(s)
        assert [t.tokens[n][o] for n, o in loc] == s
        assert [t.depth[n] + o for n, o in loc] == list(range(len(s)))
    distinct_prefixes = {tuple(s[: i + 1]) for s in seqs for i in range(len(s))}
    assert t.n_tokens == len(distinct_prefixes)
    assert t.subtree_sizes()[ROOT] == t.n_tokens
