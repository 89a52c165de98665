"""Chapter 03 solutions: paged attention, in torch and in Triton."""

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
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_ptr + token).to(tl.int64)
    if slot >= 0:
        h = tl.arange(0, HEADS_PAD)[:, None]
        d = tl.arange(0, HEAD_DIM)[None, :]
        mask = h < num_kv_heads
        dst = (slot // BLOCK_SIZE) * s_cb + (slot % BLOCK_SIZE) * s_ct + h * s_ch + d
        tl.store(k_cache_ptr + dst, tl.load(k_ptr + token * s_kt + h * s_kh + d, mask=mask), mask=mask)
        tl.store(v_cache_ptr + dst, tl.load(v_ptr + token * s_vt + h * s_vh + d, mask=mask), mask=mask)


def store_kvcache(
    k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """Task 03.1: write k, v ([T, Hkv, D]) at the flat slots slot_mapping ([T]); skip slots of -1."""
    num_tokens, num_kv_heads, head_dim = k.shape
    _store_kernel[(num_tokens,)](
        k,
        v,
        k_cache,
        v_cache,
        slot_mapping,
        k.stride(0),
        k.stride(1),
        v.stride(0),
        v.stride(1),
        *k_cache.stride()[:3],
        num_kv_heads,
        HEADS_PAD=triton.next_power_of_2(num_kv_heads),
        HEAD_DIM=head_dim,
        BLOCK_SIZE=k_cache.shape[1],
    )


def paged_decode_reference(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: torch.Tensor, seq_len: int, scale: float
) -> torch.Tensor:
    """Task 03.2: one request's decode in plain torch: q [Hq, D] over its seq_len cached tokens."""
    block_size, group = k_cache.shape[1], q.shape[0] // k_cache.shape[2]
    blocks = block_table[: -(-seq_len // block_size)].long()
    keys = k_cache[blocks].flatten(0, 1)[:seq_len].repeat_interleave(group, dim=1)  # [L, Hq, D]
    values = v_cache[blocks].flatten(0, 1)[:seq_len].repeat_interleave(group, dim=1)
    probs = (torch.einsum("hd,lhd->hl", q, keys) * scale).softmax(-1)
    return torch.einsum("hl,lhd->hd", probs, values)


def merge_splits(m: torch.Tensor, l: torch.Tensor, acc: torch.Tensor) -> torch.Tensor:
    """Task 03.3: combine split-K partials ([..., S], [..., S], [..., S, D]) into [..., D]."""
    if m.shape[-1] == 0:  # no split at all attends to nothing, like a row of empty splits: zeros
        return acc.new_zeros(*acc.shape[:-2], acc.shape[-1])
    m_max = m.amax(-1, keepdim=True)
    weight = torch.exp(m - m_max.nan_to_num(neginf=0.0))  # an empty split (m = -inf) weighs 0
    total = (weight * l).sum(-1, keepdim=True)
    out = (weight[..., None] * acc).sum(-2)
    return out / torch.where(total > 0, total, 1.0)


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
    seq = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    kv_head = head // GROUP
    seq_len = tl.load(seq_lens_ptr + seq)
    d = tl.arange(0, HEAD_DIM)
    t = tl.arange(0, BLOCK_SIZE)
    q = tl.load(q_ptr + seq * s_qb + head * s_qh + d).to(tl.float32)
    m_i = -float("inf")
    l_i = 0.0
    acc = tl.zeros([HEAD_DIM], tl.float32)
    for start in range(0, seq_len, BLOCK_SIZE):
        block = tl.load(table_ptr + seq * s_bt + start // BLOCK_SIZE).to(tl.int64)
        mask = start + t < seq_len
        rows = block * s_cb + t * s_ct + kv_head * s_ch
        k = tl.load(k_cache_ptr + rows[:, None] + d[None, :], mask=mask[:, None], other=0.0).to(tl.float32)
        v = tl.load(v_cache_ptr + rows[:, None] + d[None, :], mask=mask[:, None], other=0.0).to(tl.float32)
        s = tl.where(mask, tl.sum(q[None, :] * k, 1) * scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 0))  # finite: every block has at least one real token
        p = tl.exp(s - m_new)
        alpha = tl.exp(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 0)
        acc = acc * alpha + tl.sum(p[:, None] * v, 0)
        m_i = m_new
    out = acc / tl.where(l_i > 0, l_i, 1.0)  # seq_len 0: no block, l = 0, and the output is zeros
    tl.store(out_ptr + seq * s_ob + head * s_oh + d, out.to(out_ptr.dtype.element_ty))


def paged_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Task 03.4: the decode kernel, one program per (request, query head): q [B, Hq, D] -> [B, Hq, D]."""
    num_seqs, num_heads, head_dim = q.shape
    out = torch.empty_like(q)
    _decode_kernel[(num_seqs, num_heads)](
        q,
        k_cache,
        v_cache,
        block_tables,
        seq_lens,
        out,
        scale,
        q.stride(0),
        q.stride(1),
        out.stride(0),
        out.stride(1),
        block_tables.stride(0),
        *k_cache.stride()[:3],
        GROUP=num_heads // k_cache.shape[2],
        HEAD_DIM=head_dim,
        BLOCK_SIZE=k_cache.shape[1],
    )
    return out


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
    """Task 03.5: each new token is a decode over its causal prefix, one row per token."""
    starts = query_start_loc.tolist()
    rows, lens = [], []
    for i, seq_len in enumerate(seq_lens.tolist()):
        n = starts[i + 1] - starts[i]
        rows += [i] * n
        lens += range(seq_len - n + 1, seq_len + 1)  # token j sees positions 0 ..= seq_len - n + j
    tables = block_tables[torch.tensor(rows, dtype=torch.long, device=q.device)]
    return paged_decode(q, k_cache, v_cache, tables, torch.tensor(lens, dtype=torch.int32, device=q.device), scale)


class TritonBackend(KernelBackend):
    """The AttentionBackend seam on this module's kernels."""

    def __init__(self):
        super().__init__("triton (yours)", store_kvcache, paged_decode, paged_prefill)
