"""RadixTree: token-granular matching, edge splits, and agreement with a brute-force model."""

from hypothesis import given, settings
from hypothesis import strategies as st

from nanocourse.policies import RadixTree, longest_common_prefix


def test_longest_common_prefix():
    assert longest_common_prefix([1, 2, 3], [1, 2, 4]) == 2
    assert longest_common_prefix([1, 2], [1, 2, 3]) == 2
    assert longest_common_prefix([], [1]) == 0
    assert longest_common_prefix((5,), [6]) == 0


def test_match_is_token_granular_and_edges_split():
    tree = RadixTree()
    a = list(range(100))
    assert tree.insert(a) == 100
    assert tree.match_prefix(a) == 100
    b = a[:40] + [999] * 60
    assert tree.match_prefix(b) == 40, "stops at the exact token where b leaves a"
    assert tree.insert(b) == 60, "the shared 40 tokens are stored once"
    assert tree.num_tokens == 160 and tree.num_nodes == 4  # root, the shared 40, two tails
    assert tree.match_prefix(a[:10]) == 10
    assert tree.insert(a[:10]) == 0 and tree.num_nodes == 5, "a stored prefix splits an edge, adds no token"
    assert tree.match_prefix([7]) == 0 and tree.match_prefix([]) == 0


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.integers(0, 3), max_size=12), max_size=8), st.lists(st.integers(0, 3), max_size=12))
def test_matches_brute_force(stored, query):
    tree = RadixTree()
    for seq in stored:
        tree.insert(seq)
    assert tree.match_prefix(query) == max((longest_common_prefix(s, query) for s in stored), default=0)
    prefixes = {tuple(s[:i]) for s in stored for i in range(1, len(s) + 1)}
    assert tree.num_tokens == len(prefixes), "every distinct prefix token is stored exactly once"
