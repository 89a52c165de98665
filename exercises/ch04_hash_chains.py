"""Chapter 04 exercises: name a KV block by its content.

Check your work with:   make grade CH=04
"""

from __future__ import annotations

import struct  # noqa: F401  (turns token ids into bytes)
from collections.abc import Sequence

import xxhash

# The parent of a request's first block. Any fixed bytes work; the engine derives its own from a seed.
ROOT_HASH = xxhash.xxh3_128_digest(b"chapter-04")


def hash_block_tokens(parent_block_hash: bytes | None, token_ids: Sequence[int], extra_keys: tuple | None = None) -> bytes:
    """Task 04.1: the hash of one block, chained to its parent.

    Return 16 bytes (xxh3-128) that depend on: the parent's hash (ROOT_HASH when None), the block's
    token ids in order, and the extra keys (strings such as a LoRA name or a cache salt).

    Hints:
    - Turn the tokens into bytes unambiguously; `struct.pack(f"<{len(t)}I", *t)` is one way.
    - Put the parent's bytes first, so the hash covers the whole prefix, not just this block.
    - Extra keys must change the hash: encode them too (e.g. "\\x00".join(keys).encode()).
    - xxhash.xxh3_128_digest(data) gives the 16 bytes.
    """
    raise NotImplementedError


def hash_request_blocks(token_ids: Sequence[int], block_size: int, cache_salt: str | None = None) -> list[bytes]:
    """Task 04.2: the hash of every *full* block of a prompt, as a chain.

    Block i covers token_ids[i*block_size:(i+1)*block_size]; a partial last block gets no hash.
    cache_salt, when given, is an extra key of the FIRST block only: the chain carries it onward.

    Hints: loop over full blocks, feed each hash in as the next block's parent.
    """
    raise NotImplementedError


def num_cached_tokens(block_hashes: Sequence[bytes], cached: set[bytes], num_tokens: int, block_size: int) -> int:
    """Task 04.3: how many prompt tokens a prefix-cache lookup can skip.

    Walk block_hashes from the first; stop at the first hash not in `cached`. Each hit saves
    block_size tokens, but never let the hit cover the prompt's last token: it must be computed to
    give the logits of the next token (vLLM caps a hit at num_tokens - 1, rounded down to blocks).

    Hints: at most (num_tokens - 1) // block_size blocks can hit.
    """
    raise NotImplementedError
