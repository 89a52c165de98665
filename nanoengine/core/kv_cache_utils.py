"""Block hashing, the KV block record and the intrusive free-block queue.

Mirrors vllm/v1/core/kv_cache_utils.py for a single KV cache group.

Hashing is chained: the hash of block i covers the parent hash (block i-1, or
NONE_HASH for block 0), the block's own token ids and its extra keys, so equal
hashes mean equal prefixes. The input to the hash function is a canonical byte
string of our own, which is fast and stable across Python versions; vLLM's
default sha256 (and xxhash) pickles the (parent, tokens, extra keys) tuple, and
its *_cbor options hash canonical CBOR instead.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NewType, Protocol, runtime_checkable

import xxhash

BlockHash = NewType("BlockHash", bytes)
HashFn = Callable[[bytes], bytes]

# A fixed seed makes NONE_HASH, and hence every block hash, identical across
# processes and machines: logs and tests can show stable hashes and a router can
# predict which replica holds a prefix. The price is that anyone can compute
# the hash of any prompt and probe whether another tenant cached it. vLLM 0.33
# (resolve_none_hash_seed) uses PYTHONHASHSEED when set, else a fixed seed for
# its default sha256 and random bytes for xxhash, whose collisions could be
# crafted by whoever knows the root. nanoengine keeps xxh3 with a fixed root for
# reproducible hashes; isolation between tenants is the job of cache_salt, a
# shared engine should use sha256, and a random root is one
# `make_none_hash(fn, hash_seed=None)` away.
DEFAULT_HASH_SEED = "nanoengine"


def xxhash_128(data: bytes) -> bytes:
    return xxhash.xxh3_128_digest(data)


def sha256(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


_HASH_FUNCTIONS: dict[str, HashFn] = {"xxhash": xxhash_128, "sha256": sha256}
HASH_ALGOS = tuple(_HASH_FUNCTIONS)


def get_hash_fn_by_name(name: str) -> HashFn:
    """The hash function for a `prefix_caching_hash_algo` name."""
    try:
        return _HASH_FUNCTIONS[name]
    except KeyError:
        raise ValueError(
            f"Unknown prefix caching hash algorithm {name!r}; choose one of {sorted(_HASH_FUNCTIONS)}."
        ) from None


def make_none_hash(hash_fn: HashFn = xxhash_128, hash_seed: str | None = DEFAULT_HASH_SEED) -> BlockHash:
    """The parent hash of a request's first block.

    hash_seed=None draws a random root, as vLLM does for xxhash without
    PYTHONHASHSEED; hashes then differ between processes. Either way the root
    has the hash function's digest size, so every parent in the chain has the
    same length.
    """
    seed = os.urandom(32) if hash_seed is None else hash_seed.encode()
    return BlockHash(hash_fn(seed))


NONE_HASH = make_none_hash()


def make_block_hash_with_group_id(block_hash: BlockHash, kv_cache_group_id: int) -> BlockHash:
    """The key of a block in a KV cache group: its hash and the group id, as vLLM keys them.

    The same tokens have one hash in every group, but each group's block holds other layers'
    KV, so a full-attention layer must never be served a sliding layer's block. Group 0 keeps
    the bare hash (vLLM appends 0 too): a model with one group names its blocks by the hashes of
    hash_block_tokens. Every hash of one hasher has one length, so a
    bare hash never equals another group's longer key.
    """
    if kv_cache_group_id == 0:
        return block_hash
    return BlockHash(block_hash + kv_cache_group_id.to_bytes(4, "big"))


_U32 = struct.Struct("<I")
_token_structs: dict[int, struct.Struct] = {}


def _pack_tokens(token_ids: Sequence[int]) -> bytes:
    # The count comes first so that token bytes can never be confused with
    # the extra-key bytes that follow them.
    n = len(token_ids)
    packer = _token_structs.get(n)
    if packer is None:
        packer = _token_structs[n] = struct.Struct(f"<I{n}I")
    try:
        return packer.pack(n, *token_ids)
    except struct.error:
        raise ValueError(f"Token ids must be integers in [0, 2**32); got {list(token_ids)!r}.") from None


def _encode_key(key: Any) -> bytes:
    if isinstance(key, str):
        tag, payload = b"s", key.encode()
    elif isinstance(key, bytes):
        tag, payload = b"b", key
    elif isinstance(key, int) and not isinstance(key, bool):
        tag, payload = b"i", key.to_bytes(key.bit_length() // 8 + 1, "little", signed=True)
    elif isinstance(key, tuple):
        tag, payload = b"t", encode_extra_keys(key)
    else:
        raise TypeError(
            f"Extra hash keys must be str, bytes, int or tuples of them; got {type(key).__name__}: {key!r}."
        )
    return tag + _U32.pack(len(payload)) + payload


def encode_extra_keys(extra_keys: tuple[Any, ...]) -> bytes:
    """Canonical bytes for extra keys: a tag, a length and a payload per key."""
    return b"".join(map(_encode_key, extra_keys))


def hash_block_tokens(
    parent_block_hash: BlockHash | None,
    curr_block_token_ids: Sequence[int],
    extra_keys: tuple[Any, ...] | None = None,
    hash_fn: HashFn = xxhash_128,
) -> BlockHash:
    """Hash one block, chained to its parent.

    parent_block_hash=None means the first block of a request and uses the
    module's NONE_HASH; a hasher with another seed passes its own root.
    """
    data = (parent_block_hash or NONE_HASH) + _pack_tokens(curr_block_token_ids)
    if extra_keys:
        data += encode_extra_keys(extra_keys)
    return BlockHash(hash_fn(data))


class HashableRequest(Protocol):
    """What the block hasher reads from a request."""

    block_hashes: list[BlockHash]
    cache_salt: str | None
    lora_name: str | None

    @property
    def all_token_ids(self) -> Sequence[int]: ...


def generate_block_hash_extra_keys(request: HashableRequest, start_token_idx: int) -> tuple[Any, ...] | None:
    """Extra keys of the block starting at start_token_idx.

    The LoRA name goes on every block. The salt goes on the first block only:
    the chain carries it into every later hash.
    """
    keys: tuple[Any, ...] = ()
    if request.lora_name is not None:
        keys += (request.lora_name,)
    if start_token_idx == 0 and request.cache_salt:
        keys += (request.cache_salt,)
    return keys or None


class BlockTokensHasher(Protocol):
    """The block-hash seam: name one block by its content, chained to its parent.

    hash_block_tokens above is the engine's; any other function of this shape runs the real
    engine through get_request_block_hasher(hash_block=...) or LLM(hash_block_tokens=...). It must
    be deterministic, and differ when the parent, the tokens (in order) or the extra keys differ.
    """

    def __call__(
        self,
        parent_block_hash: BlockHash | None,
        curr_block_token_ids: Sequence[int],
        extra_keys: tuple[Any, ...] | None = None,
    ) -> BlockHash: ...


def get_request_block_hasher(
    block_size: int,
    hash_fn: HashFn = xxhash_128,
    none_hash: BlockHash | None = None,
    hash_block: BlockTokensHasher | None = None,
) -> Callable[[HashableRequest], list[BlockHash]]:
    """A function that hashes the request's full blocks not hashed yet.

    It returns only the new hashes; the caller extends request.block_hashes.
    A partial last block is left for a later call, once it is full.
    none_hash defaults to the root of hash_fn with the default seed.
    hash_block(parent, tokens, extra_keys) replaces hash_block_tokens, so another
    chained hash (a BlockTokensHasher) can run the real engine.
    """
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}.")
    root = make_none_hash(hash_fn) if none_hash is None else none_hash
    if hash_block is None:

        def hash_block_with_fn(
            parent_block_hash: BlockHash | None,
            curr_block_token_ids: Sequence[int],
            extra_keys: tuple[Any, ...] | None = None,
        ) -> BlockHash:
            return hash_block_tokens(parent_block_hash, curr_block_token_ids, extra_keys, hash_fn)

        hash_block = hash_block_with_fn

    def request_block_hasher(request: HashableRequest) -> list[BlockHash]:
        start = len(request.block_hashes) * block_size
        tokens = request.all_token_ids
        parent = request.block_hashes[-1] if request.block_hashes else root
        new_hashes: list[BlockHash] = []
        for end in range(start + block_size, len(tokens) + 1, block_size):
            extra_keys = generate_block_hash_extra_keys(request, end - block_size)
            parent = hash_block(parent, tokens[end - block_size : end], extra_keys)
            new_hashes.append(parent)
        return new_hashes

    return request_block_hasher


@dataclass(slots=True, eq=False)
class KVCacheBlock:
    """Metadata of one KV block; the KV tensors live on the device.

    Invariants kept by BlockPool: ref_cnt is the number of running requests
    holding the block; a non-null block sits in the free queue iff its ref_cnt
    is 0; a block has a hash iff it is in the prefix-cache map. The null block
    (block 0) is never in the free queue and its ref_cnt is never tracked.
    Equality is identity, which keeps `in` checks and deque.remove cheap.
    """

    block_id: int
    ref_cnt: int = 0
    _block_hash: BlockHash | None = None
    # Links of the intrusive FreeKVCacheBlockQueue; None when not in it.
    prev_free_block: KVCacheBlock | None = None
    next_free_block: KVCacheBlock | None = None
    is_null: bool = False

    @property
    def block_hash(self) -> BlockHash | None:
        return self._block_hash

    @block_hash.setter
    def block_hash(self, block_hash: BlockHash) -> None:
        if self._block_hash is not None:
            raise ValueError(f"Block {self.block_id} already has a hash; reset_hash() it first.")
        self._block_hash = block_hash

    def reset_hash(self) -> None:
        self._block_hash = None

    def __repr__(self) -> str:
        # The default repr would follow the links through the whole queue.
        prev_id = self.prev_free_block.block_id if self.prev_free_block else None
        next_id = self.next_free_block.block_id if self.next_free_block else None
        return (
            f"KVCacheBlock(block_id={self.block_id}, ref_cnt={self.ref_cnt}, "
            f"block_hash={self._block_hash!r}, prev_free_block={prev_id}, "
            f"next_free_block={next_id}, is_null={self.is_null})"
        )


@runtime_checkable
class FreeBlockQueue(Protocol):
    """The free-queue seam (BlockPool's free_queue_cls): what BlockPool calls on its free queue.

    The head is evicted first. A block is in the queue iff its ref_cnt is 0 (the pool keeps that
    true); remove must be O(1), because a prefix-cache hit on a free block takes it out of the
    middle. FreeKVCacheBlockQueue below is the engine's; BlockPool(free_queue_cls=...) takes another.
    """

    num_free_blocks: int

    # BlockPool builds its queue as free_queue_cls(blocks): every block, block 0 first, all free.
    def __init__(self, blocks: list[KVCacheBlock]) -> None: ...
    def popleft(self) -> KVCacheBlock: ...
    def popleft_n(self, n: int) -> list[KVCacheBlock]: ...
    def remove(self, block: KVCacheBlock) -> None: ...
    def append(self, block: KVCacheBlock) -> None: ...
    def append_n(self, blocks: Sequence[KVCacheBlock]) -> None: ...
    def prepend_n(self, blocks: Sequence[KVCacheBlock]) -> None: ...
    def get_all_free_blocks(self) -> list[KVCacheBlock]: ...


class FreeKVCacheBlockQueue:
    """Free blocks as a doubly linked list threaded through the blocks.

    A deque cannot remove from the middle in O(1), and a prefix-cache hit on a
    free block must do exactly that. Two sentinels (block_id -1) bound the
    list, so no operation special-cases an empty list or an end.

    The head is evicted first. Callers keep the order meaningful: free blocks
    without a hash are prepended (reused first), cached ones appended in LRU
    order. append/append_n/prepend_n trust the caller that the blocks are not
    in the queue already (BlockPool guarantees it through ref_cnt).
    """

    def __init__(self, blocks: list[KVCacheBlock]) -> None:
        self.num_free_blocks = len(blocks)
        self.fake_free_list_head = KVCacheBlock(block_id=-1)
        self.fake_free_list_tail = KVCacheBlock(block_id=-1)
        chain = [self.fake_free_list_head, *blocks, self.fake_free_list_tail]
        for prev, nxt in itertools.pairwise(chain):
            prev.next_free_block = nxt
            nxt.prev_free_block = prev

    def popleft(self) -> KVCacheBlock:
        return self.popleft_n(1)[0]

    def popleft_n(self, n: int) -> list[KVCacheBlock]:
        if not 0 <= n <= self.num_free_blocks:
            raise ValueError(
                f"Cannot take {n} blocks: {self.num_free_blocks} are free. Ask for "
                f"0..{self.num_free_blocks}, or free (preempt) requests first."
            )
        head = self.fake_free_list_head
        curr = head.next_free_block
        assert curr is not None  # the sentinels bound the list: a linked block always has neighbours
        ret = []
        for _ in range(n):
            ret.append(curr)
            nxt = curr.next_free_block
            assert nxt is not None
            curr.prev_free_block = curr.next_free_block = None
            curr = nxt
        # curr is at worst the tail sentinel, never None.
        head.next_free_block = curr
        curr.prev_free_block = head
        self.num_free_blocks -= n
        return ret

    def remove(self, block: KVCacheBlock) -> None:
        prev, nxt = block.prev_free_block, block.next_free_block
        if prev is None or nxt is None:
            raise ValueError(f"remove() called on a block that is not in the free queue: {block}")
        prev.next_free_block = nxt
        nxt.prev_free_block = prev
        block.prev_free_block = block.next_free_block = None
        self.num_free_blocks -= 1

    def append(self, block: KVCacheBlock) -> None:
        # Linked in place rather than through append_n: for one block the tuple and the loop cost
        # as much as the links themselves (remove + append 297 -> 190 ns, bench/block_pool.py).
        tail = self.fake_free_list_tail
        last = tail.prev_free_block
        assert last is not None  # at worst the head sentinel
        last.next_free_block = block
        block.prev_free_block = last
        block.next_free_block = tail
        tail.prev_free_block = block
        self.num_free_blocks += 1

    def append_n(self, blocks: Sequence[KVCacheBlock]) -> None:
        """Append blocks at the tail, keeping their order."""
        tail = self.fake_free_list_tail
        assert tail.prev_free_block is not None  # at worst the head sentinel
        self._insert_n(blocks, tail.prev_free_block, tail)

    def prepend_n(self, blocks: Sequence[KVCacheBlock]) -> None:
        """Insert blocks at the head, keeping their order."""
        head = self.fake_free_list_head
        assert head.next_free_block is not None  # at worst the tail sentinel
        self._insert_n(blocks, head, head.next_free_block)

    def _insert_n(self, blocks: Sequence[KVCacheBlock], prev: KVCacheBlock, nxt: KVCacheBlock) -> None:
        # Chain the blocks between two adjacent nodes (a sentinel at one end).
        for block in blocks:
            block.prev_free_block = prev
            prev.next_free_block = block
            prev = block
        prev.next_free_block = nxt
        nxt.prev_free_block = prev
        self.num_free_blocks += len(blocks)

    def get_all_free_blocks(self) -> list[KVCacheBlock]:
        """The free blocks from head (evicted first) to tail. O(n)."""
        ret = []
        curr = self.fake_free_list_head.next_free_block
        tail = self.fake_free_list_tail
        while curr is not tail:
            assert curr is not None  # every block between the sentinels is linked on both sides
            ret.append(curr)
            curr = curr.next_free_block
        return ret
