"""A compressed prefix tree (radix trie) over token-id sequences.

Each node holds a run of tokens with no branching inside it; a node's children are keyed by
their first token. Node 0 is an empty root sentinel. Sequences are inserted whole and can be
located afterwards token by token as ``(node, offset)`` pairs. Inserting a sequence that
ends inside a node does not split it (only a divergence does), so a chain of prefixes stays
one node.

This module knows nothing about steps, rows, masks or tensors: see ``layout`` for those.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["PrefixTrie", "ROOT"]

ROOT = 0


class PrefixTrie:
    """Compressed trie; nodes are integer ids indexing parallel lists."""

    def __init__(self) -> None:
        self.tokens: list[tuple[int, ...]] = [()]
        self.children: list[dict[int, int]] = [{}]
        self.parent: list[int] = [-1]
        self.depth: list[int] = [0]  # depth (position id) of the node's first token

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def n_tokens(self) -> int:
        """Tokens stored once each: the cost of running the whole tree through a model."""
        return sum(len(t) for t in self.tokens)

    def _new(self, tokens: tuple[int, ...], parent: int, depth: int) -> int:
        self.tokens.append(tokens)
        self.children.append({})
        self.parent.append(parent)
        self.depth.append(depth)
        return len(self.tokens) - 1

    def _split(self, node: int, at: int) -> None:
        """Cut ``node`` after ``at`` tokens; the tail becomes its only child."""
        toks = self.tokens[node]
        tail = self._new(toks[at:], node, self.depth[node] + at)
        self.children[tail] = self.children[node]
        for c in self.children[tail].values():
            self.parent[c] = tail
        self.tokens[node] = toks[:at]
        self.children[node] = {toks[at]: tail}

    def insert(self, seq: Sequence[int]) -> None:
        """Add one sequence; shared prefixes are stored once."""
        seq = tuple(seq)
        node, i, n = ROOT, 0, len(seq)
        while i < n:
            child = self.children[node].get(seq[i])
            if child is None:
                self.children[node][seq[i]] = self._new(seq[i:], node, i)
                return
            toks = self.tokens[child]
            m = len(toks)
            if seq[i : i + m] != toks:
                m = _common_prefix(toks, seq, i)
                if i + m < n:  # diverges inside the node
                    self._split(child, m)
            node, i = child, i + m

    def locate(self, seq: Sequence[int]) -> list[tuple[int, int]]:
        """``(node, offset)`` of every token of an inserted sequence."""
        out: list[tuple[int, int]] = []
        node, i, n = ROOT, 0, len(seq)
        while i < n:
            child = self.children[node].get(seq[i])
            if child is None:
                raise KeyError(f"sequence not in trie (diverges at position {i})")
            m = min(len(self.tokens[child]), n - i)
            out.extend((child, o) for o in range(m))
            node, i = child, i + m
        return out

    def subtree_sizes(self) -> list[int]:
        """Tokens in each node's subtree, the node's own included."""
        size = [len(t) for t in self.tokens]
        for node in reversed(self.preorder()):
            p = self.parent[node]
            if p >= 0:
                size[p] += size[node]
        return size

    def preorder(self, start: int = ROOT) -> list[int]:
        """Node ids depth-first, children in token order (iterative: tries can be deep)."""
        out, stack = [], [start]
        while stack:
            node = stack.pop()
            out.append(node)
            stack.extend(self.children[node][k] for k in sorted(self.children[node], reverse=True))
        return out


def _common_prefix(a: tuple[int, ...], b: tuple[int, ...], start: int) -> int:
    m = 0
    for x, y in zip(a, b[start:], strict=False):
        if x != y:
            break
        m += 1
    return m
