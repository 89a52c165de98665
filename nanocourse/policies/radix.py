"""A radix tree over token ids: the prefix index of SGLang's RadixAttention, token-granular.

The engine's prefix cache names whole 16-token blocks by chained hashes and looks them up in a
flat map, so two prompts that part ways in the middle of a block share only the blocks before it.
A radix tree (a trie whose edges carry runs of tokens) matches to the exact token where they part.
Shared prefixes are stored once, as shared edges; an edge is split where a new sequence leaves it.
"""

from __future__ import annotations

from collections.abc import Sequence


def longest_common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens a and b share."""
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


class RadixNode:
    """One edge of the tree and the node it leads to.

    key is the edge's run of tokens (never empty, except at the root); children are keyed by the
    first token of their key, so siblings never start with the same token.
    """

    __slots__ = ("children", "key")

    def __init__(self, key: tuple[int, ...] = ()) -> None:
        self.key = key
        self.children: dict[int, RadixNode] = {}


class RadixTree:
    """A set of token sequences, answering "how many leading tokens of this prompt are stored?".

    Invariants: a node other than the root has a non-empty key; sibling keys start with different
    tokens; num_tokens is the sum of all key lengths (each stored prefix token counted once).
    """

    def __init__(self) -> None:
        self.root = RadixNode()
        self.num_tokens = 0
        self.num_nodes = 1

    def match_prefix(self, tokens: Sequence[int]) -> int:
        """The length of the longest stored prefix of tokens, to the token."""
        _, pos, _, shared = self._walk(tuple(tokens))
        return pos + shared

    def insert(self, tokens: Sequence[int]) -> int:
        """Store tokens; returns how many of them were new (the rest were a stored prefix)."""
        tokens = tuple(tokens)
        node, pos, child, shared = self._walk(tokens)
        if child is not None:
            node, pos = self._split(node, child, shared), pos + shared
        if pos == len(tokens):
            return 0
        node.children[tokens[pos]] = RadixNode(tokens[pos:])
        self.num_nodes += 1
        self.num_tokens += len(tokens) - pos
        return len(tokens) - pos

    def _walk(self, tokens: tuple[int, ...]) -> tuple[RadixNode, int, RadixNode | None, int]:
        """Follow tokens down whole edges: (the deepest node reached, tokens consumed there, the
        edge where the walk stopped partway or None, how many of its tokens matched)."""
        node, pos = self.root, 0
        while pos < len(tokens):
            child = node.children.get(tokens[pos])
            if child is None:
                break
            key, part = child.key, tokens[pos : pos + len(child.key)]
            # Slices compare in C: a whole edge costs one comparison, not one per token.
            if part != key:
                return node, pos, child, longest_common_prefix(key, part)
            node, pos = child, pos + len(key)
        return node, pos, None, 0

    def _split(self, parent: RadixNode, child: RadixNode, at: int) -> RadixNode:
        """Cut child's edge after `at` tokens; returns the new middle node."""
        middle = RadixNode(child.key[:at])
        child.key = child.key[at:]
        middle.children[child.key[0]] = child
        parent.children[middle.key[0]] = middle
        self.num_nodes += 1
        return middle
