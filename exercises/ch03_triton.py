"""Chapter 03 exercises: paged attention, in torch and in Triton.

Cache layout (one layer): k_cache and v_cache are [num_blocks, block_size, num_kv_heads, head_dim],
last dim contiguous, both with the same strides. Token t of a request lives in block
block_table[t // block_size] at offset t % block_size: flat slot block_id * block_size + offset.
Query head h reads KV head h // group, where group = num_heads // num_kv_heads.

On a CPU the kernels run in the Triton interpreter (the graders set TRITON_INTERPRET=1). It has no
bounds checking: the graders fill every slot no request owns with NaN, so a stray load shows up.

Check your work with:   make grade CH=03
"""

from __future__ import annotations

import torch
import triton  # noqa: F401  (triton.next_power_of_2 is what you need in the launchers)
import triton.language as tl

from nanoengine.attention.backend import KernelBackend


@triton.jit
def _store_kernel(k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, slot_ptr,
                  s_kt, s_kh, s_vt, s_vh, s_cb, s_ct, s_ch,
                  num_kv_heads, HEADS_PAD: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    """One program per new token: copy its [num_kv_heads, HEAD_DIM] rows of k and v to its slot.

    s_kt, s_kh: k's token and head strides (s_vt, s_vh for v); s_cb, s_ct, s_ch: the cache's block,
    offset and head strides. The last dim is contiguous everywhere (stride 1).

    Hints:
    - token = tl.program_id(0).to(tl.int64); slot = tl.load(slot_ptr + token).to(tl.int64).
      Cast to int64 BEFORE multiplying by a stride: block * s_cb overflows int32 on a big pool.
    - Skip padding: do the copy only `if slot >= 0:`.
    - tl.arange needs a power-of-two length and SmolLM2 has 3 KV heads: take
      h = tl.arange(0, HEADS_PAD)[:, None] and d = tl.arange(0, HEAD_DIM)[None, :], then mask h < num_kv_heads
      in both the load and the store.
    - Destination offset: (slot // BLOCK_SIZE) * s_cb + (slot % BLOCK_SIZE) * s_ct + h * s_ch + d.
    """


def store_kvcache(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                  slot_mapping: torch.Tensor) -> None:
    """Task 03.1: write k, v ([T, Hkv, D]) at the flat slots slot_mapping ([T]); skip slots of -1.

    Fill in _store_kernel above, then launch it here with one program per token:
    _store_kernel[(num_tokens,)](k, v, k_cache, v_cache, slot_mapping, <the 7 strides>, num_kv_heads,
    HEADS_PAD=..., HEAD_DIM=..., BLOCK_SIZE=...). Pass strides from tensor.stride(), never assume them:
    k and v may be views of a wider qkv tensor. The grader checks that a Triton kernel did the writing.
    """
    raise NotImplementedError


def paged_decode_reference(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: torch.Tensor,
                           seq_len: int, scale: float) -> torch.Tensor:
    """Task 03.2: one request's decode step in plain torch: q [Hq, D] attends to its seq_len cached
    tokens, found through block_table ([max_blocks] int32, padded with the null block 0) -> [Hq, D].

    Hints:
    - Gather the ceil(seq_len / block_size) blocks the request uses, flatten (block, offset) into
      one token axis, and cut it at seq_len: the rest of the last block is not this request's.
    - GQA: repeat each KV head `group` times along the head axis (repeat_interleave, not repeat).
    - softmax(q·k * scale) over the tokens, then the weighted sum of v. torch.einsum keeps it short.
    """
    raise NotImplementedError


def merge_splits(m: torch.Tensor, l: torch.Tensor, acc: torch.Tensor) -> torch.Tensor:  # noqa: E741
    """Task 03.3: the split-K reduce. A context cut into S ranges gives, per range s and query head,
    m[..., s] = max score in the range, l[..., s] = sum of exp(score - m), and
    acc[..., s, :] = sum of exp(score - m) * v. Combine them into softmax(scores) @ v: [..., D].

    Shapes: m and l [..., S], acc [..., S, D]. A range with no token has m = -inf, l = 0, acc = 0;
    if every range is empty, return zeros (not NaN).

    Hints:
    - Rescale every partial to the overall max M: weight_s = exp(m_s - M); then
      out = sum_s weight_s * acc_s / sum_s weight_s * l_s.
    - Never compute exp(m) alone: scores can be in the thousands.
    - exp(-inf - (-inf)) is NaN. Where M is -inf, subtract 0 instead; where the total is 0, divide by 1.
    """
    raise NotImplementedError


@triton.jit
def _decode_kernel(q_ptr, k_cache_ptr, v_cache_ptr, table_ptr, seq_lens_ptr, out_ptr, scale,
                   s_qb, s_qh, s_ob, s_oh, s_bt, s_cb, s_ct, s_ch,
                   GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    """Program (request, query head): online softmax over the request's blocks, one block per step.

    s_qb, s_qh: q's strides; s_ob, s_oh: out's; s_bt: the block table's row stride; s_cb, s_ct, s_ch:
    the cache's block, offset and head strides (k_cache and v_cache share them).

    Hints:
    - seq = tl.program_id(0).to(tl.int64), head = tl.program_id(1), kv_head = head // GROUP,
      seq_len = tl.load(seq_lens_ptr + seq); q = tl.load(...) as float32 of HEAD_DIM lanes.
    - Start from m = -float("inf"), l = 0.0, acc = tl.zeros([HEAD_DIM], tl.float32), and loop
      `for start in range(0, seq_len, BLOCK_SIZE):`
        block = the table entry start // BLOCK_SIZE, cast to int64;
        t = tl.arange(0, BLOCK_SIZE); mask = start + t < seq_len   (the last block is partial);
        load K and V rows [BLOCK_SIZE, HEAD_DIM] with mask=mask[:, None], other=0.0;
        s = tl.sum(q[None, :] * k, 1) * scale, and -inf where masked;
        m_new = max(m, max(s)); p = exp(s - m_new); alpha = exp(m - m_new);
        l = l * alpha + sum(p); acc = acc * alpha + sum(p[:, None] * v, 0); m = m_new.
    - Store acc / l, but divide by 1 where l is 0: a request with seq_len 0 must give zeros.
    """


def paged_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
                 seq_lens: torch.Tensor, scale: float) -> torch.Tensor:
    """Task 03.4: the decode kernel, one program per (request, query head): q [B, Hq, D] -> [B, Hq, D].

    block_tables [B, max_blocks] int32 (padded with 0), seq_lens [B] int32. Fill in _decode_kernel,
    then launch it on a (B, Hq) grid into out = torch.empty_like(q) and return out.
    (The engine's kernel runs one program per KV head instead, so K and V are read once per group.)
    """
    raise NotImplementedError


def paged_prefill(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
                  query_start_loc: torch.Tensor, seq_lens: torch.Tensor, max_query_len: int,
                  scale: float) -> torch.Tensor:
    """Task 03.5: chunks of new tokens (already stored) attend causally to their cached prefix and to
    themselves: q [T, Hq, D] -> [T, Hq, D]. Request i owns rows query_start_loc[i]:query_start_loc[i+1]
    and has seq_lens[i] tokens of context, the last of which are its new ones.

    Hints:
    - New token j of request i sits at position seq_lens[i] - n_i + j (n_i: its new tokens) and sees
      the keys at positions 0 ..= that position: exactly a decode over the first position + 1 tokens.
    - So one row per new token does it with your decode kernel: q as it is (T rows), the request's
      block-table row repeated for each of its tokens (index block_tables with a LongTensor of request
      numbers), and seq_len = position + 1 for each token. Then return paged_decode(...) on those.
    - The engine's own prefill kernel (nanoengine/attention/triton_kernels.py) tiles the queries
      instead, so K and V are read once per tile rather than once per token.
    """
    raise NotImplementedError


class TritonBackend(KernelBackend):
    """Your kernels behind the engine's AttentionBackend seam: LLM(attention_backend=TritonBackend())
    runs every attention layer through them (given: the glue is not a task)."""

    def __init__(self):
        super().__init__("triton (yours)", store_kvcache, paged_decode, paged_prefill)
