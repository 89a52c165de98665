"""Chapter 04 solutions: name a KV block by its content."""

from __future__ import annotations

import struct
from collections.abc import Sequence

import xxhash

ROOT_HASH = xxhash.xxh3_128_digest(b"chapter-04")


def hash_block_tokens(
    parent_block_hash: bytes | None, token_ids: Sequence[int], extra_keys: tuple | None = None
) -> bytes:
    """Task 04.1: the hash of one block, chained to its parent."""
    data = ROOT_HASH if parent_block_hash is None else parent_block_hash  # None, and only None, is the root
    # The count first: tokens then can never run into the extra-key bytes that follow.
    data += struct.pack(f"<I{len(token_ids)}I", len(token_ids), *token_ids)
    # Each key by its length, then its bytes: a separator could occur inside a key (("a\x00b",) against ("a", "b")).
    for key in extra_keys or ():
        encoded = str(key).encode()
        data += struct.pack("<I", len(encoded)) + encoded
    return xxhash.xxh3_128_digest(data)


def hash_request_blocks(token_ids: Sequence[int], block_size: int, cache_salt: str | None = None) -> list[bytes]:
    """Task 04.2: the hash of every full block of a prompt, as a chain."""
    hashes, parent = [], None
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        keys = (cache_salt,) if cache_salt and start == 0 else None
        parent = hash_block_tokens(parent, token_ids[start : start + block_size], keys)
        hashes.append(parent)
    return hashes


def num_cached_tokens(block_hashes: Sequence[bytes], cached: set[bytes], num_tokens: int, block_size: int) -> int:
    """Task 04.3: how many prompt tokens a prefix-cache lookup can skip."""
    hits = 0
    for block_hash in block_hashes[: max(num_tokens - 1, 0) // block_size]:  # never the last token
        if block_hash not in cached:
            break
        hits += 1
    return hits * block_size
