"""Chapter 09 exercises: beyond vLLM's defaults.

A radix tree that matches prompts to the token, a frequency-aware eviction order, and the two halves
of a cache-aware router: the index it rebuilds from KV events, and the routing rule.

Check your work with:   make grade CH=09
"""

from __future__ import annotations

from collections import deque  # noqa: F401  (two queues make the eviction order of task 09.3)
from collections.abc import Iterable, Sequence

from nanoengine.core import AllBlocksCleared, BlockRemoved, BlockStored, KVCacheEvent  # noqa: F401


def longest_common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Task 09.1: how many leading tokens a and b share.

    longest_common_prefix([1, 2, 3], [1, 2, 4]) == 2; a sequence shares all of itself with a longer
    one that starts with it; an empty sequence shares nothing.

    Hints: walk i over range(min(len(a), len(b))) and stop at the first a[i] != b[i].
    """
    raise NotImplementedError


class RadixTree:
    """Task 09.2: a set of token sequences that answers "how many leading tokens of this prompt are
    stored?" to the exact token, storing each shared prefix once.

    - insert(tokens) stores a sequence and returns how many of its tokens were new;
    - match_prefix(tokens) returns the length of the longest stored prefix of tokens;
    - num_tokens is the number of tokens stored (each distinct prefix token counted once):
      inserting 100 tokens, then 100 that share the first 40 with them, stores 160.

    Hints:
    - A node is a dict {first token of an edge: (edge tokens as a tuple, child node)}. Start from
      an empty root dict.
    - match: follow the edge that starts with the next token; compare the edge with the same
      number of prompt tokens; on a partial match add longest_common_prefix and stop.
    - insert: on a partial match, split the edge in two (the shared part, then the rest) before
      hanging the new tail off the split point; with no edge at all, add the remaining tokens as
      one new edge.
    """

    def __init__(self) -> None:
        self.num_tokens = 0

    def insert(self, tokens: Sequence[int]) -> int:
        raise NotImplementedError

    def match_prefix(self, tokens: Sequence[int]) -> int:
        raise NotImplementedError


def slru_eviction_order(freed: Sequence[tuple[int, bool]], protected_cap: int) -> list[int]:
    """Task 09.3: the frequency-aware pool's eviction order for cached blocks freed one at a time.

    freed lists (block_id, reused) in the order the blocks were freed; reused means the block got
    a cache hit since it was cached. A freed block joins the newest end of one of two segments:
    protected if reused, probation otherwise. Whenever protected holds more than protected_cap
    blocks, its oldest block is demoted to the newest end of probation. Eviction takes probation
    oldest-first, then protected oldest-first: return the block ids in that order.

    Hints: two collections.deque; after each append, `while len(protected) > protected_cap`.
    """
    raise NotImplementedError


def route(request_hashes: Sequence[bytes], replica_hashes: Sequence[set[bytes]], loads: Sequence[int]) -> int:
    """Task 09.4: the index of the replica a cache-aware router sends the request to.

    A replica's match is the number of *leading* request hashes it holds: the chain means a hash
    after a miss is useless even if present. Pick the longest match; on a tie the smallest load;
    on a tie again the lowest index.

    Hints: min(range(n), key=lambda r: (-match[r], loads[r], r)).
    """
    raise NotImplementedError


def apply_events(counts: dict[bytes, int], events: Iterable[KVCacheEvent]) -> None:
    """Task 09.5: update a replica's index (hash -> number of cached copies) from its KV events.

    BlockStored adds one copy of each of its block_hashes; BlockRemoved removes one copy of each
    (delete a hash whose count reaches 0); AllBlocksCleared empties the index. Mutate counts.

    Why counts: two requests with the same prompt in chunked prefill at the same time each cache
    their own copy of the same blocks, and evicting one copy emits BlockRemoved while the other copy
    still serves hits.

    Hints: isinstance(event, BlockStored) etc. (from nanoengine.core).
    """
    raise NotImplementedError
