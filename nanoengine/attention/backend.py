"""The paged-attention seam: one interface, a torch reference and Triton kernels behind it.

Layout, per layer: k_cache and v_cache are [num_blocks, block_size, num_kv_heads, head_dim], the shape of vLLM
0.33's K and V views (vLLM packs both into one [num_blocks, num_kv_heads, block_size, 2 * head_dim] tensor).
Token t of a request lives in block `block_table[t // block_size]` at offset `t % block_size`, i.e. at
flat slot `block_id * block_size + offset`. Block 0 is the null block: it pads block tables and is
never read for a real token.

A step's new tokens are flat ([T, ...]) and grouped by request: request i owns rows
query_start_loc[i] : query_start_loc[i+1], and after this step its context holds seq_lens[i] tokens,
the last (query_start_loc[i+1] - query_start_loc[i]) of which are the new ones.

A sliding-window layer passes `sliding_window=W` to decode and prefill: the token at position p then
sees keys p - W + 1 .. p only. Full-attention layers pass nothing, so a backend that only serves
full attention (KernelBackend's launchers, for one) needs no such argument at run time; the Protocol
states the full signature, which KernelBackend meets with **window (refusing a window).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import torch


def is_pow2(x: int, at_least: int) -> bool:
    """The Triton kernels' shape rule (tl.arange and tl.dot take powers of two), also checked by LLM(...)."""
    return x >= at_least and x & (x - 1) == 0


@dataclass(slots=True)
class AttentionMetadata:
    """Everything a backend needs to find each request's K/V for one step.

    Invariants: requests whose query length is 1 (decodes) come first, `num_decodes` of them; slot
    entries of -1 are padding and are never written; block_tables rows are padded with 0.
    """

    slot_mapping: torch.Tensor  # [T] int64
    query_start_loc: torch.Tensor  # [B + 1] int32, cumulative new-token counts
    seq_lens: torch.Tensor  # [B] int32, context length after this step
    block_tables: torch.Tensor  # [B, max_blocks] int32
    max_query_len: int
    max_seq_len: int
    num_decodes: int  # the first num_decodes requests have exactly one new token
    # Leading blocks that every decode request shares (the same block ids): a common system prompt.
    num_common_prefix_blocks: int = 0


class AttentionBackend(Protocol):
    """Three operations, each with a torch reference (TorchBackend) and a Triton kernel.

    supports_cuda_graphs: whether a decode step through it may be captured once and replayed (its kernels
    read only the tensors they are given, and allocate nothing that changes between steps).
    """

    name: str
    supports_cuda_graphs: bool

    def store_kvcache(
        self, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor
    ) -> None:
        """Write k, v ([T, Hkv, D]) into the caches at slot_mapping ([T]); skip slots of -1."""

    def decode(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        block_tables: torch.Tensor,
        seq_lens: torch.Tensor,
        scale: float,
        num_common_prefix_blocks: int = 0,
        *,
        sliding_window: int | None = None,
    ) -> torch.Tensor:
        """One query per request: q [B, Hq, D] attends to all seq_lens[b] cached tokens -> [B, Hq, D]
        (the last W of them under sliding_window=W). num_common_prefix_blocks is a hint: that many
        leading blocks are the same for every request."""

    def prefill(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        block_tables: torch.Tensor,
        query_start_loc: torch.Tensor,
        seq_lens: torch.Tensor,
        max_query_len: int,
        scale: float,
        *,
        sliding_window: int | None = None,
    ) -> torch.Tensor:
        """Chunks of new tokens (already stored) attend causally to their cached prefix and to
        themselves: q [T, Hq, D] -> [T, Hq, D]. query_start_loc and seq_lens are relative to this call."""


class KernelBackend:
    """An AttentionBackend over three launchers with the Triton kernels' signatures: store_kvcache(k, v,
    k_cache, v_cache, slot_mapping), paged_decode(q, k_cache, v_cache, block_tables, seq_lens, scale) and
    paged_prefill(q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, max_query_len, scale).
    Any module of such launchers (nanoengine's own Triton kernels, or a replacement) serves the engine through it."""

    supports_cuda_graphs = False

    def __init__(self, name: str, store_kvcache, paged_decode, paged_prefill):
        self.name = name
        self._store, self._decode, self._prefill = store_kvcache, paged_decode, paged_prefill

    def store_kvcache(self, k, v, k_cache, v_cache, slot_mapping):
        self._store(k, v, k_cache, v_cache, slot_mapping)

    def decode(self, q, k_cache, v_cache, block_tables, seq_lens, scale, num_common_prefix_blocks=0, **window):
        _full_attention_only(self.name, window)
        return self._decode(q, k_cache, v_cache, block_tables, seq_lens, scale)  # reads a shared prefix in place

    def prefill(self, q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, max_query_len, scale, **window):
        _full_attention_only(self.name, window)
        return self._prefill(q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, max_query_len, scale)


def _full_attention_only(name: str, window: dict) -> None:
    if window:
        raise ValueError(
            f"The {name} kernels serve full attention only, and this model has sliding-window layers: "
            "serve it with attention_backend='torch' or 'triton'."
        )


def decode_step_bytes(
    seq_lens: list[int], num_heads: int, num_kv_heads: int, head_dim: int, elt: int, table_width: int
) -> int:
    """Bytes one decode step must move: K and V of every context token, q in and o out, the int32
    block tables and seq_lens. bench/attention.py divides this by the measured time to report bandwidth."""
    batch = len(seq_lens)
    kv = 2 * sum(seq_lens) * num_kv_heads * head_dim * elt
    return kv + 2 * batch * num_heads * head_dim * elt + batch * table_width * 4 + batch * 4


def gather_kv(cache: torch.Tensor, block_table: torch.Tensor, seq_len: int) -> torch.Tensor:
    """One request's first seq_len tokens, made contiguous: [seq_len, Hkv, D]."""
    num_blocks = -(-seq_len // cache.shape[1])
    return _gather_blocks(cache, block_table[None, :num_blocks].long())[0, :seq_len]


class TorchBackend:
    """The reference: gather each request's blocks into a contiguous tensor, then SDPA.

    Runs on any device and is easy to trust, but the gather copies the whole context every step,
    which is exactly the cost a paged kernel avoids. One exception serves a CPU decoding for one user: a request
    that decodes alone keeps its gathered context from step to step (_Layer), each step adding its new token.
    A decode attends in fp32 whatever the caches' dtype, as the cascade path's softmax does: one query a request is
    too little work to gain from bf16, and torch's CPU SDPA takes 6x longer in bf16 than in fp32 where the CPU has
    no native bf16 (avx512_bf16 or AMX), converting its operands on every call. Prefill attends in the query's dtype.

    Invariants: the caches are written only through store_kvcache; slot_mapping, block_tables and seq_lens are
    not edited in place once passed (the runner builds new ones every step), so a step reads its padding, its
    one request's context length and its block index once, not once a layer.
    """

    name = "torch"
    supports_cuda_graphs = False  # the gather's shapes follow each step's seq_lens
    MIN_CONTEXT = 256  # tokens: the least a kept context holds, so a short request's decode reallocates it never

    def __init__(self):
        self._slots: tuple[torch.Tensor, bool, int | None] | None = None  # this step's (slot_mapping, padded, slot)
        self._one: _OneDecode | None = None  # the last step that decoded one request alone
        self._layers: dict[int, _Layer] = {}  # id(k_cache) -> what this backend keeps of that layer

    def _layer(self, k_cache: torch.Tensor, v_cache: torch.Tensor) -> _Layer:
        layer = self._layers.get(id(k_cache))
        if layer is None or layer.k_cache is not k_cache:
            layer = self._layers[id(k_cache)] = _Layer(k_cache, v_cache)
        return layer

    def store_kvcache(self, k, v, k_cache, v_cache, slot_mapping):
        if self._slots is None or self._slots[0] is not slot_mapping:
            one_slot = int(slot_mapping[0]) if slot_mapping.shape[0] == 1 else None
            self._slots = (slot_mapping, bool((slot_mapping < 0).any()), one_slot)
        _, padded, one_slot = self._slots
        if padded:  # padding (a CUDA graph's), never written
            valid = slot_mapping >= 0
            slot_mapping, k, v = slot_mapping[valid], k[valid], v[valid]
        layer = self._layer(k_cache, v_cache)
        k, v = _as(k, k_cache.dtype), _as(v, v_cache.dtype)
        # index_copy_ writes the rows in place; a masked index_put costs a mask and a nonzero per tensor.
        layer.k_flat.index_copy_(0, slot_mapping, k)
        layer.v_flat.index_copy_(0, slot_mapping, v)
        layer.stored(one_slot if not padded else None, k, v)

    def decode(
        self, q, k_cache, v_cache, block_tables, seq_lens, scale, num_common_prefix_blocks=0, sliding_window=None
    ):
        if sliding_window is None and num_common_prefix_blocks and q.shape[0] > 1:
            return self._cascade_decode(q, k_cache, v_cache, block_tables, seq_lens, scale, num_common_prefix_blocks)
        if sliding_window is None and q.shape[0] == 1:
            # One request sees all its keys: no padding, so no mask, and no zeroing of a padded copy. Same
            # numbers as the padded path (its all-true mask adds zeros), at about half the time on 2 cores.
            one = self._one
            if one is None or one.block_tables is not block_tables or one.seq_lens is not seq_lens:
                one = self._one = _OneDecode.next(one, block_tables, seq_lens, k_cache.shape[1])
            keys, values = self._layer(k_cache, v_cache).context(one, self.MIN_CONTEXT)
            out = torch.nn.functional.scaled_dot_product_attention(
                _as(q, torch.float32).unsqueeze(2), keys, values, scale=scale, enable_gqa=True
            )
            return _as(out.squeeze(2), q.dtype)
        keys, values, mask = gather_padded(k_cache, v_cache, block_tables, seq_lens)
        if sliding_window is not None:
            positions = torch.arange(mask.shape[1], device=mask.device)
            mask &= positions[None, :] >= (seq_lens[:, None] - sliding_window)
        q32, keys, values = (
            _as(x, torch.float32) for x in (q.unsqueeze(2), keys.transpose(1, 2), values.transpose(1, 2))
        )
        return _as(_sdpa(q32, keys, values, mask[:, None, None, :], scale).squeeze(2), q.dtype)

    def _cascade_decode(self, q, k_cache, v_cache, block_tables, seq_lens, scale, num_prefix_blocks):
        """Cascade attention (the name vLLM used until 0.33 removed it): the shared prefix is gathered once, and
        all B requests' queries meet its keys in ONE matmul; each request's own suffix is scored apart. With 16
        requests behind one system prompt this reads the prefix once, not 16 times. vLLM's kernels then merged the
        two partial softmaxes by their log-sum-exp (split-K's merge); here the two sets of scores are joined and one
        softmax runs over them: the same numbers in fewer ops (16 requests behind 576 shared tokens, bf16 caches, 2
        cores: 0.72 against 1.07 ms a layer for the merge). In fp32, as every decode. A request with no token past
        the prefix needs no care: its suffix scores are all masked, and its softmax runs over the prefix's alone."""
        b, hq, d = q.shape
        block_size, hkv = k_cache.shape[1], k_cache.shape[2]
        # Transposed and widened in one pass (a cache already in fp32 stays a transposed view).
        f32 = {"dtype": torch.float32, "memory_format": torch.contiguous_format}
        prefix = block_tables[:1, :num_prefix_blocks].long()
        pk, pv = (_gather_blocks(c, prefix)[0].transpose(0, 1).to(**f32) for c in (k_cache, v_cache))  # [Hkv, P, D]
        p_len = pk.shape[1]
        suffix_lens = seq_lens - p_len
        width = int(suffix_lens.max())
        tables = block_tables[:, num_prefix_blocks : num_prefix_blocks - (-width // block_size)].long()
        sk, sv = (_gather_blocks(c, tables)[:, :width].transpose(1, 2).to(**f32) for c in (k_cache, v_cache))
        pad = torch.arange(width, device=seq_lens.device)[None, :] >= suffix_lens[:, None]
        # Padding may hold stale or NaN values: zeroed in V; a padded key's score is overwritten whatever it is.
        sv.masked_fill_(pad[:, None, :, None], 0.0)
        qg = q.view(b, hkv, hq // hkv, d).transpose(0, 1).to(**f32)  # [Hkv, B, G, D]: a KV head's queries together
        prefix_scores = torch.matmul(qg.reshape(hkv, -1, d), pk.transpose(1, 2)).view(*qg.shape[:3], p_len)
        suffix_scores = torch.matmul(qg.transpose(0, 1), sk.transpose(2, 3)).masked_fill_(pad[:, None, None], -math.inf)
        weights = torch.cat((prefix_scores, suffix_scores.transpose(0, 1)), dim=-1).mul_(scale).softmax(-1)
        out = torch.matmul(weights[..., p_len:].transpose(0, 1), sv)  # [B, Hkv, G, D]
        prefix_out = torch.matmul(weights[..., :p_len].reshape(hkv, -1, p_len), pv).view(qg.shape)
        return out.add_(prefix_out.transpose(0, 1)).view(b, hq, d).to(q.dtype)

    def prefill(
        self, q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, max_query_len, scale, sliding_window=None
    ):
        out = torch.empty_like(q)
        starts = query_start_loc.tolist()
        for i, seq_len in enumerate(seq_lens.tolist()):
            lo, hi = starts[i], starts[i + 1]
            n = hi - lo
            keys = gather_kv(k_cache, block_tables[i], seq_len).transpose(0, 1)
            values = gather_kv(v_cache, block_tables[i], seq_len).transpose(0, 1)
            # New token j sits at position seq_len - n + j and sees keys 0 .. seq_len - n + j. With no
            # cached prefix that is the plain causal mask, which SDPA runs on its fused path.
            mask = causal_mask(n, seq_len, sliding_window, q.device)
            # A leading batch dim of 1: CPU SDPA takes its fused kernel only for 4-D inputs.
            o = _sdpa(q[lo:hi].transpose(0, 1)[None], keys[None], values[None], mask, scale)
            out[lo:hi] = o[0].transpose(0, 1)
        return out


def _as(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """x in dtype; x itself where it is already (a no-op .to() still costs a dispatch, 60 a token)."""
    return x if x.dtype == dtype else x.to(dtype)


@dataclass(slots=True, eq=False)
class _OneDecode:
    """A step that decodes one request alone: its context length n, its blocks, the slot its new token went to,
    and its run, an identity it shares with the last such step exactly when all that step's blocks begin this one's
    (the same request, most likely: a running request's blocks, and the tokens in them, never change under it).
    All, not only the blocks of this step's first n - 1 tokens: a run must be transitive, since a layer a step
    skipped (an exception after the first layer) still holds a context from an earlier step of the run."""

    block_tables: torch.Tensor
    seq_lens: torch.Tensor
    n: int
    blocks: list[int]
    slot: int
    run: object

    @classmethod
    def next(cls, last: _OneDecode | None, block_tables, seq_lens, block_size: int) -> _OneDecode:
        n = int(seq_lens[0])
        blocks = block_tables[0, : -(-n // block_size)].tolist()
        same = last is not None and blocks[: len(last.blocks)] == last.blocks
        slot = blocks[-1] * block_size + (n - 1) % block_size if n else -1  # an empty context (a test's) has none
        return cls(block_tables, seq_lens, n, blocks, slot, last.run if same else object())


_OTHER = object()  # _Layer.new after any store but one token's between two one-request decodes


class _Layer:
    """What TorchBackend keeps of one layer: flat [slots, Hkv, D] views of its caches, and the context of the
    request last decoding alone, keys and values [1, Hkv, capacity, D] in fp32 whose first n positions hold its first n
    tokens as of a step of run `run`. new: what store_kvcache wrote since (None, the one token's (slot, k, v), or
    _OTHER). The context grows by doubling: at most twice one request's K and V, made on its first such step."""

    __slots__ = ("k_cache", "k_flat", "keys", "n", "new", "run", "v_cache", "v_flat", "values")

    def __init__(self, k_cache: torch.Tensor, v_cache: torch.Tensor):
        self.k_cache, self.v_cache = k_cache, v_cache
        self.k_flat, self.v_flat = (c.view(-1, *c.shape[2:]) for c in (k_cache, v_cache))
        self.keys = self.values = k_cache.new_empty((1, k_cache.shape[2], 0, k_cache.shape[3]), dtype=torch.float32)
        self.n, self.run, self.new = 0, None, None

    def stored(self, slot: int | None, k: torch.Tensor, v: torch.Tensor) -> None:
        self.new = (slot, k, v) if slot is not None and self.new is None else _OTHER

    def context(self, one: _OneDecode, min_capacity: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The request's keys and values, [1, Hkv, n, D] each: the last step's plus the new token when this layer
        saw nothing else since, gathered from the blocks otherwise."""
        n, new = one.n, self.new
        self.new = None
        if n > self.keys.shape[2]:
            capacity = max(n, 2 * self.keys.shape[2], min_capacity)
            self.keys, self.values = (
                x.new_empty((*x.shape[:2], capacity, x.shape[3])) for x in (self.keys, self.values)
            )
            self.run = None
        if self.run is one.run and self.n == n - 1 and new is not None and new is not _OTHER and new[0] == one.slot:
            self.keys.select(2, n - 1).copy_(new[1])
            self.values.select(2, n - 1).copy_(new[2])
        else:
            for cache, rows in ((self.k_cache, self.keys), (self.v_cache, self.values)):
                rows[0, :, :n] = gather_kv(cache, one.block_tables[0], n).transpose(0, 1)
        self.n, self.run = n, one.run
        return self.keys[:, :, :n], self.values[:, :, :n]


def causal_mask(n: int, seq_len: int, sliding_window: int | None, device) -> torch.Tensor | None:
    """[n, seq_len] mask of the keys each of the last n tokens sees: token j at position
    p = seq_len - n + j sees p - W + 1 .. p (0 .. p without a window). None for the plain causal mask,
    which SDPA runs on its fused path."""
    if sliding_window is None and n == seq_len:
        return None
    mask = torch.ones(n, seq_len, dtype=torch.bool, device=device).tril(seq_len - n)
    if sliding_window is not None:
        mask &= ~torch.ones_like(mask).tril(seq_len - n - sliding_window)
    return mask


def gather_padded(k_cache, v_cache, block_tables, seq_lens):
    """Each request's first seq_lens[b] tokens as [B, S, Hkv, D] copies padded to the longest, and the
    [B, S] mask of real positions."""
    block_size = k_cache.shape[1]
    max_len = int(seq_lens.max())
    tables = block_tables[:, : -(-max_len // block_size)].long()
    mask = torch.arange(max_len, device=seq_lens.device)[None, :] < seq_lens[:, None]
    keys, values = (_gather_blocks(c, tables)[:, :max_len] for c in (k_cache, v_cache))
    # Zero each row's padding so stale or NaN contents of unused slots cannot leak through 0 * NaN;
    # slicing the tails is far cheaper than a masked pass over the whole copy.
    for b, n in enumerate(seq_lens.tolist()):
        keys[b, n:] = 0
        values[b, n:] = 0
    return keys, values, mask


def _gather_blocks(cache: torch.Tensor, tables: torch.Tensor) -> torch.Tensor:
    """cache's blocks at tables [B, N] (int64) as [B, N * block_size, Hkv, D], one index_select for all rows."""
    # index_select copies whole blocks; indexing with cache[...] goes element by element, 2-3x slower on CPU.
    return cache.index_select(0, tables.flatten()).view(*tables.shape, *cache.shape[1:]).flatten(1, 2)


def _sdpa(q, k, v, mask, scale):
    """SDPA in the query's dtype with GQA; q [..., Hq, L, D], k/v [..., Hkv, S, D]; mask None = causal."""
    return torch.nn.functional.scaled_dot_product_attention(
        q, k.to(q.dtype), v.to(q.dtype), attn_mask=mask, is_causal=mask is None, scale=scale, enable_gqa=True
    )
