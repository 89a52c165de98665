"""Chapter 03 exercises: paged attention, in torch and in Triton.

Cache layout (one layer): k_cache and v_cache are [num_blocks, block_size, num_kv_heads, head_dim],
last dim contiguous, both with the same strides. Token t of a request lives in block
block_table[t // block_size] at offset t % block_size: flat slot block_id * block_size + offset.
Block 0 is the null block: it pads block tables and holds no token of anyone.
Query head h reads KV head h // group, where group = num_heads // num_kv_heads (GQA; SmolLM2's group is 3).
block_size and head_dim are powers of two (tl.arange only takes power-of-two lengths); num_kv_heads and the
group need not be. The graders use fp32, block_size 8 or 16 and head_dim 16 or 32.

On a CPU the kernels run in the Triton interpreter (the graders set TRITON_INTERPRET=1). It has no
bounds checking: the graders fill every slot no request owns with NaN, so a stray load shows up.
Tasks 03.1, 03.4, 03.5 and 03.6 watch the interpreter's loads: a kernel defined in this file must do the
reading, so a torch fallback does not pass.

Check your work with:   make grade CH=03
Stuck? In the notebook, `from nanocourse import hint; hint("03")` lists this chapter's hints, from a nudge to
close-to-code; open them one at a time with hint("03", n).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from nanoengine.attention.backend import KernelBackend


@triton.jit
def _store_kernel(
    k_ptr,
    v_ptr,
    k_cache_ptr,
    v_cache_ptr,
    slot_ptr,
    s_kt,
    s_kh,
    s_vt,
    s_vh,
    s_cb,
    s_ct,
    s_ch,
    num_kv_heads,
    HEADS_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
):
    """Program t (one per new token) copies token t's [num_kv_heads, HEAD_DIM] rows of k and v to the
    caches at slot slot_ptr[t], and does nothing when that slot is -1.

    s_kt, s_kh: k's token and head strides (s_vt, s_vh for v); s_cb, s_ct, s_ch: the caches' block, offset and
    head strides; every stride counts elements, and the last dim is contiguous everywhere (stride 1).
    HEADS_PAD is a power of two >= num_kv_heads (tl.arange's rule); lanes past num_kv_heads must neither load
    nor store. (vLLM 0.33: reshape_and_cache_kernel_flash in vllm/v1/attention/ops/triton_reshape_and_cache_flash.py.)
    """


def store_kvcache(
    k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """Tasks 03.1 and 03.1b: write this step's new k and v ([T, Hkv, D]) into the caches at their slots.

    Contract: for every token t with slot_mapping[t] >= 0 (int64 [T], as in vLLM), the rows k[t] and v[t] land at
    that flat slot of k_cache and v_cache; a slot of -1 is padding and writes nothing; no other slot, and no
    memory outside the caches, changes (the grader surrounds them with guard blocks). Any num_kv_heads works,
    3 included. k and v may be views of a wider tensor, so their token stride is not Hkv * D: read strides from
    tensor.stride(), never assume them. A Triton kernel of this file (_store_kernel) does the writing.
    (vLLM 0.33: triton_reshape_and_cache_flash in vllm/v1/attention/ops/triton_reshape_and_cache_flash.py,
    whose kernel returns early for a slot below 0.)
    Example: caches [3, 4, 3, 16] (block_size 4, 3 KV heads) and slot_mapping [5, -1, 8]: k[0] lands at
    k_cache[1, 1] (block 1, offset 1), token 1 is skipped, k[2] lands at k_cache[2, 0]; only those two slots
    change, in k_cache and in v_cache alike.
    """
    raise NotImplementedError


def paged_decode_reference(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: torch.Tensor, seq_len: int, scale: float
) -> torch.Tensor:
    """Task 03.2: one request's decode step in plain torch, the reference the kernels are held to.

    Contract: q [Hq, D] attends to the request's seq_len cached tokens, found through block_table ([max_blocks]
    int32, padded with the null block 0): out[h] = softmax over those tokens of (q[h] . k * scale), weighted
    sum of their v, with query head h reading KV head h // group. Returns [Hq, D]. Only the seq_len tokens count:
    the rest of the last block and the table's padding hold garbage (NaN in the grader) that must not reach the
    output. (vLLM 0.33 has no torch version: this is what unified_attention in
    vllm/v1/attention/ops/triton_unified_attention.py computes for one decode query; nanoengine's
    TorchBackend.decode is the batched reference.)
    Example: block_size 4, one KV head and 2 query heads, every key 0 (so every score is 0 and the weights are
    uniform), token t's value (t, 10t), block_table [2, 1, 0], seq_len 5: tokens 0-3 are block 2, token 4 is
    block 1's offset 0, and both heads return (2, 20), the mean of the five values, whatever block 1's other
    slots hold.
    """
    raise NotImplementedError


def merge_splits(m: torch.Tensor, l: torch.Tensor, acc: torch.Tensor) -> torch.Tensor:
    """Task 03.3: the split-K reduce: combine the partial results of S ranges of one context.

    Contract: for range s of a query head's scores, m[..., s] is the range's max score, l[..., s] the sum of
    exp(score - m[..., s]) and acc[..., s, :] the sum of exp(score - m[..., s]) * v (m and l [..., S], acc
    [..., S, D]). Return softmax(all scores) @ v, [..., D], within 1e-4. Scores may be in the thousands, where
    exp of a score overflows fp32. A range with no token has m = -inf, l = 0, acc = 0 and weighs nothing; when
    every range is empty, and when there is no range at all (S = 0), the result is zeros, never NaN.
    (vLLM 0.33: reduce_segments in vllm/v1/attention/ops/triton_unified_attention.py, which returns 0 where
    the total exp sum is 0; nanoengine's reduce_splits_kernel.)
    Example: m [0, 1], l [1, 1], acc [[1], [2]] gives (e**-1 * 1 + 2) / (e**-1 + 1) = 1.7311;
    m [-inf, 0], l [0, 2], acc [[0], [6]] gives 3.0; m and l of shape [0] with acc [0, 2] give [0, 0].
    """
    raise NotImplementedError


@triton.jit
def _decode_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    table_ptr,
    seq_lens_ptr,
    out_ptr,
    scale,
    s_qb,
    s_qh,
    s_ob,
    s_oh,
    s_bt,
    s_cb,
    s_ct,
    s_ch,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
):
    """Program (request b, query head h) writes out[b, h]: q[b, h] attending to request b's seq_lens[b] tokens
    through its row of the block table, in fp32, without holding all of the request's scores at once.

    s_qb, s_qh: q's strides; s_ob, s_oh: out's; s_bt: the block table's row stride; s_cb, s_ct, s_ch: the
    caches' block, offset and head strides (k_cache and v_cache share them). It loads no slot the request does
    not own (the null block padding the table, the rest of the last block), and a request with seq_lens 0
    writes zeros. (vLLM 0.33: kernel_unified_attention in vllm/v1/attention/ops/triton_unified_attention.py.)
    """


def paged_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Tasks 03.4, 03.4b and 03.4c: one decode step for a batch, in Triton: q [B, Hq, D] -> [B, Hq, D].

    Contract: out[b] is paged_decode_reference(q[b], k_cache, v_cache, block_tables[b], seq_lens[b], scale),
    within 1e-4, for block_tables [B, max_blocks] int32 (padded with 0) and seq_lens [B] int32; a request with
    seq_lens 0 gets zeros, not NaN, and does not disturb the others. _decode_kernel does the reading, one program
    per (request, query head) on a (B, Hq) grid.
    int64 addresses (03.4c): a block id times the block stride can pass 2**31 elements (a cache over 8 GiB of
    fp32), so the address of a block must be computed in 64 bits: in int32 it wraps, and the kernel silently
    reads another block. 03.4c names block 16,777,217 of a cache whose blocks are 256 elements: it starts at
    element 4,294,967,552, which int32 arithmetic wraps to 256, block 1 (all NaN). On a CPU the grader does not
    allocate that 16 GiB cache: it passes a 4-block cache and reroutes the loads of block 16,777,217 to a real
    block. So read the caches in place (no copies), and take block ids from the table without checking them
    against k_cache.shape[0]. Kernel arguments annotated tl.int64 count as int64 there, as on a GPU.
    (vLLM 0.33: unified_attention in vllm/v1/attention/ops/triton_unified_attention.py, whose kernel casts each
    block id it loads with .to(tl.int64) and types its strides tl.int64; its programs own a KV head and all of
    its query heads, so K and V are read once per group, as in the engine's kernel.)
    Example: the cache of paged_decode_reference's example, with head_dim 16 (values (t, 10t, 0, ...)), q of 2
    requests, block_tables [[2, 1, 0], [0, 0, 0]] and seq_lens [5, 0]: request 0's heads both give
    (2, 20, 0, ...), and request 1's are all zeros.
    """
    raise NotImplementedError


def paged_prefill(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    max_query_len: int,
    scale: float,
) -> torch.Tensor:
    """Task 03.5: chunks of new tokens, already stored, attend causally to their cached prefix and to
    themselves, in Triton: q [T, Hq, D] -> [T, Hq, D].

    Contract: request i owns rows query_start_loc[i]:query_start_loc[i+1] (int32 [B + 1]) of q, n_i new tokens,
    and has seq_lens[i] tokens of context, the last n_i of which are the new ones: its new token j sits at
    position seq_lens[i] - n_i + j and sees the keys at positions 0 ..= that position, no later one. The result
    equals TorchBackend.prefill within 1e-4; a Triton kernel of this file does the reading (yours, or
    _decode_kernel), and the int64 rule of paged_decode holds here too (03.5 names the same far block).
    max_query_len is the largest n_i, for a kernel that tiles the queries. (vLLM 0.33: unified_attention in
    vllm/v1/attention/ops/triton_unified_attention.py serves prefill and decode alike, with a causal mask over
    blocks of queries.)
    Example: the cache of paged_decode's example, block_tables [[2, 1, 0]], seq_lens [5], query_start_loc [0, 2]:
    the 2 new tokens are positions 3 and 4, so row 0 gives (1.5, 15, 0, ...), the mean of tokens 0-3, and row 1
    gives (2, 20, 0, ...).
    """
    raise NotImplementedError


class TritonBackend(KernelBackend):
    """Your kernels behind the engine's AttentionBackend seam: LLM(attention_backend=TritonBackend())
    runs every attention layer through them (given: the glue is not a task)."""

    def __init__(self):
        super().__init__("triton (yours)", store_kvcache, paged_decode, paged_prefill)
