"""Chapter 04 exercises: name a KV block by its content.

Check your work with:   make grade CH=04
Stuck? In the notebook, `from nanocourse import hint; hint("04")` lists this chapter's hints, from a nudge to
close-to-code; open them one at a time with hint("04", n).
"""

from __future__ import annotations

import struct  # noqa: F401  (turns token ids into bytes)
from collections.abc import Sequence

import xxhash

# The parent of a request's first block. Any fixed bytes work; the engine derives its own from a seed.
ROOT_HASH = xxhash.xxh3_128_digest(b"chapter-04")


def hash_block_tokens(
    parent_block_hash: bytes | None, token_ids: Sequence[int], extra_keys: tuple | None = None
) -> bytes:
    """Task 04.1: the hash of one block, chained to its parent.

    Contract:
    - Returns 16 bytes, a `bytes` object (an xxh3-128 digest): not a hex string, not a 64-bit hash.
    - Deterministic: the same inputs give the same hash, in any process (a list or a tuple of the same ids
      alike); the ids' content counts, never the object's identity.
    - Covers the parent: the hash names the whole prefix, so another parent gives another hash.
      None, and only None, means the first block, whose parent is ROOT_HASH: (None, t) and (ROOT_HASH, t)
      hash alike, while b"" is a parent like any other (vLLM's `if not parent_block_hash` differs here).
    - Covers the token ids, all of them, in order: other ids or another order give another hash. Each id
      (any int in [0, 2**32), vocabularies run past 65,536) is encoded unambiguously and fully, so that
      no two different lists of ids make the same bytes: 16 bits per id cannot hold them (70000 would
      wrap onto 4464), and a joined decimal string collides ([1, 23] and [12, 3] both read "123"). Nor
      may the ids' bytes run into the extra keys' bytes.
    - Covers the extra keys, a tuple of strings such as a LoRA name or a cache salt (None or () means
      none; the engine passes strings only): keys change the hash, and by their content, so ("tenant-1",)
      and ("tenant-2",) differ.
    - The engine's prefix cache runs on it (get_request_block_hasher(hash_block=...)): a second request
      with the same first 32 tokens hits the two blocks the first one cached.
    vLLM 0.33: hash_block_tokens in vllm/v1/core/kv_cache_utils.py; there the hash function takes the
    tuple (parent, tokens, extra_keys) and serializes it with pickle or CBOR, unambiguous by construction.
    Example: h = hash_block_tokens(None, [1, 2, 3, 4]) is 16 bytes and equals
    hash_block_tokens(ROOT_HASH, [1, 2, 3, 4]); hash_block_tokens(h, [5, 6, 7, 8]) differs from
    hash_block_tokens(None, [5, 6, 7, 8]); hash_block_tokens(None, [1, 23]) differs from
    hash_block_tokens(None, [12, 3]).
    """
    raise NotImplementedError


def hash_request_blocks(token_ids: Sequence[int], block_size: int, cache_salt: str | None = None) -> list[bytes]:
    """Task 04.2: the hash of every *full* block of a prompt, as a chain.

    Contract:
    - One hash per full block, len(token_ids) // block_size of them, in block order; block i covers
      token_ids[i*block_size:(i+1)*block_size]. A partial last block gets no hash, and its tokens enter
      no hash: the prompt's first 48 tokens give the same list as the same 48 plus 2 more.
    - A chain: block i's hash is hash_block_tokens of its tokens with block i-1's hash as parent (None, so
      ROOT_HASH, for block 0). A change in block 0 changes every hash; prompts that share their first k
      blocks share their first k hashes.
    - cache_salt, when given (None or "" means no salt), is an extra key of the FIRST block only,
      (cache_salt,); later blocks get no extra keys. The chain carries the salt into every later hash,
      so a salted prompt shares no hash with the unsalted one, and "alice" and "bob" differ from block 0.
    - Deterministic: the same tokens and salt give the same hashes.
    vLLM 0.33: get_request_block_hasher in vllm/v1/core/kv_cache_utils.py (hashes a request's new full
    blocks, chained to its last hash), with generate_block_hash_extra_keys there putting the salt on the
    block that starts at token 0 only.
    Example: hs = hash_request_blocks(list(range(10)), 4) has 2 hashes (tokens 8 and 9 make no full block):
    hs[0] == hash_block_tokens(None, [0, 1, 2, 3]) and hs[1] == hash_block_tokens(hs[0], [4, 5, 6, 7]).
    With cache_salt="alice": hs[0] == hash_block_tokens(None, [0, 1, 2, 3], ("alice",)) and
    hs[1] == hash_block_tokens(hs[0], [4, 5, 6, 7]), no key on block 1.
    """
    raise NotImplementedError


def num_cached_tokens(block_hashes: Sequence[bytes], cached: set[bytes], num_tokens: int, block_size: int) -> int:
    """Task 04.3: how many prompt tokens a prefix-cache lookup can skip.

    Contract:
    - The hit is the longest run of hashes in `cached` from block_hashes[0]: the first miss ends it, and
      a hash cached after a miss does not count (chained hashes: a later block can only match if every
      earlier one does).
    - Each hit block saves block_size tokens: the result is a multiple of block_size, 0 when block 0
      misses or there are no hashes.
    - The hit never covers the prompt's last token, which must be computed to give the logits of the next
      token: it is capped at num_tokens - 1 tokens, rounded down to whole blocks. So a block-aligned
      prompt whose blocks are all cached still recomputes its last block.
    vLLM 0.33: KVCacheManager.get_computed_blocks in vllm/v1/core/kv_cache_manager.py (max_cache_hit_length
    = request.num_tokens - 1), with FullAttentionManager.find_longest_cache_hit in
    vllm/v1/core/single_type_kv_cache_manager.py walking the hashes to the first miss.
    Example: num_cached_tokens([b"h0", b"h1", b"h2"], {b"h0", b"h2"}, 40, 16) == 16 (h1 misses);
    num_cached_tokens([b"h0", b"h1"], {b"h0", b"h1"}, 32, 16) == 16 but with num_tokens=33 it is 32.
    """
    raise NotImplementedError
