"""Triton kernels for the paged KV cache: store, decode (with split-K) and prefill/extend.

Cache layout per layer: [num_blocks, block_size, num_kv_heads, head_dim], last dim contiguous.
Token t of a request lives at block `block_table[t // block_size]`, offset `t % block_size`.

Shared invariants of the kernels:
- block ids are cast to int64 before they multiply a stride: block_id * stride overflows int32 on
  pools of a few GiB and silently reads the wrong block;
- every K/V load is masked by the request's length, so neither the partial last block nor the null
  block padding a table is ever read (a masked lane yields 0 and its score is set to -inf);
- softmax runs in fp32 with exp2, and a row whose scores are all -inf keeps m = -inf and l = 0
  without producing NaN (the max is replaced by 0 before it is subtracted);
- head_dim and block_size are powers of two (head_dim >= 16), so no head_dim mask is needed.

The launchers take torch tensors and return torch tensors; on a CPU tensor they run under the Triton
interpreter (TRITON_INTERPRET=1 must be set before triton is imported).

The launchers (store_kvcache, paged_decode, paged_prefill) are the API. The @triton.jit kernels they launch
are public too, so that tools can name them without reaching into the module: store_kernel, decode_kernel,
reduce_splits_kernel (split-K's merge) and prefill_kernel. vLLM 0.33's counterparts are
reshape_and_cache_kernel_flash, kernel_unified_attention_3d with reduce_segments, and
kernel_unified_attention_2d.
"""

from __future__ import annotations

import functools
import math

import torch
import triton
import triton.language as tl

from nanoengine.attention.backend import is_pow2

# tl.dot needs a reduction dimension (K) of at least 16 for 16-bit operands (8 in fp32): min_dot_size in Triton
# 3.9's NVIDIA backend. Older Triton asked 16 of every dimension, so query rows are padded to 16 as well; 3.9
# would pad fewer rows itself.
DOT_MIN = 16
# KV tokens per decode tile: several cache blocks gathered through the table. Compiled offline
# (bench/kernels_offline.py, bf16, 4 warps), a 64-token tile takes 64 registers at SmolLM2's d64 and
# 96 (sm_90) to 114 (sm_80) at d128, no spills, and 21-40 KB of shared memory: 4 to 8 programs per SM.
DECODE_BLOCK_N = 64
PREFILL_BLOCK_M = 64  # one Hopper warpgroup MMA (M=64) with 4 warps
PREFILL_BLOCK_N = 64
# Below sm_80 (Turing: the T4) Triton lowers tl.dot to FMA on CUDA cores instead of tensor-core MMA
# (triton-lang/triton#5066), holding both operand tiles in fp32 registers. Compiled for sm_75 at the tiles
# above, decode needed 255 registers and spilled 280-328 B, prefill spilled 3.5-5.4 KB; 16-key tiles
# (and 32 query rows in prefill) fit in at most 128 registers with no spills (bench/kernels_offline.py).
TURING_DECODE_BLOCK_N = 16
TURING_PREFILL_BLOCK_M, TURING_PREFILL_BLOCK_N = 32, 16
NUM_WARPS = 4
NUM_STAGES = 2  # double-buffers the K/V tile loads (cp.async) when strides are multiples of 16
# Split-K heuristic (see choose_num_splits): split until there are about this many programs per SM,
# but never give a split fewer than MIN_SPLIT_TOKENS tokens, nor make more than MAX_SPLITS splits.
PROGRAMS_PER_SM = 8
MIN_SPLIT_TOKENS = 256
MAX_SPLITS = 32


@triton.jit
def store_kernel(
    k_ptr,
    v_ptr,
    k_cache_ptr,
    v_cache_ptr,
    slot_ptr,
    s_kt,
    s_kh,
    s_vt,
    s_vh,
    s_kcb,
    s_kct,
    s_kch,
    s_vcb,
    s_vct,
    s_vch,
    num_kv_heads,
    HEADS_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
):
    """One program per new token: copy its K and V rows ([Hkv, D]) to the slot; slot -1 is skipped."""
    t = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    if slot < 0:
        return
    block, offset = slot // BLOCK_SIZE, slot % BLOCK_SIZE
    h = tl.arange(0, HEADS_PAD)[:, None]
    d = tl.arange(0, HEAD_DIM)[None, :]
    mask = h < num_kv_heads
    k = tl.load(k_ptr + t * s_kt + h * s_kh + d, mask=mask)
    v = tl.load(v_ptr + t * s_vt + h * s_vh + d, mask=mask)
    k_dst = k_cache_ptr + block * s_kcb + offset * s_kct + h * s_kch + d
    v_dst = v_cache_ptr + block * s_vcb + offset * s_vct + h * s_vch + d
    tl.store(k_dst, k.to(k_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(v_dst, v.to(v_cache_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _row_ptrs(base, rows, HEAD_DIM: tl.constexpr):
    """Pointers to HEAD_DIM contiguous elements at each offset of `rows`: a [len(rows), HEAD_DIM] tile.

    The launchers guarantee (aligned16) a 16-byte aligned base and row offsets of whole 16-byte
    units; saying so lets the compiler load each row in 16-byte vectors whatever Triton's launch
    specialisation inferred. Without it one 64-bit address per element filled ~210 registers.
    """
    ptrs = base + rows[:, None] + tl.arange(0, HEAD_DIM)[None, :]
    return tl.max_contiguous(tl.multiple_of(ptrs, [16, 16]), [1, HEAD_DIM])


@triton.jit
def _load_kv_tile(
    cache_ptr, table_ptr, n, n_mask, kv_head, s_b, s_t, s_h, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr
):
    """K or V rows of token positions n ([BLOCK_N]) of one request: a [BLOCK_N, HEAD_DIM] tile.

    A tile may span several cache blocks; each token looks up its own block id. Masked tokens read
    nothing (0), so the table's null-block padding and the tail of the last block are never touched.
    """
    block = tl.load(table_ptr + n // BLOCK_SIZE, mask=n_mask, other=0)
    # int64 only for the block's base: block * s_b overflows int32 on a pool of a few GiB, while the
    # offset inside a block is small.
    rows = block.to(tl.int64) * s_b + ((n % BLOCK_SIZE) * s_t + kv_head * s_h)
    return tl.load(_row_ptrs(cache_ptr, rows, HEAD_DIM), mask=n_mask[:, None], other=0.0)


@triton.jit
def online_softmax_step(q, k, v, mask, m_i, l_i, acc, qk_scale, DOT_PRECISION: tl.constexpr):
    """Fold one KV tile into the running (max, sum, acc) of each query row; scores in log2 units."""
    s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale
    s = tl.where(mask, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    # A row with no visible key yet has m_new = -inf; subtracting 0 instead keeps p and alpha at 0.
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_safe)
    p = tl.exp2(s - m_safe[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
    return m_new, l_i, acc


@triton.jit
def decode_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    table_ptr,
    seq_lens_ptr,
    out_ptr,
    part_m_ptr,
    part_l_ptr,
    qk_scale,
    tokens_per_split,
    window,
    s_qb,
    s_qh,
    s_ob,
    s_oh,
    s_ps,
    s_bt,
    s_kb,
    s_kt,
    s_kh,
    s_vb,
    s_vt,
    s_vh,
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    SPLIT: tl.constexpr,
    SLIDING: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """Program (seq, kv_head, split): all GROUP query heads of one KV head over one range of tokens.

    The group is padded to GROUP_PAD rows (a power of two, at least DOT_MIN) so K and V are read
    once per group. Without SPLIT the program covers the whole context and writes the output; with
    SPLIT it writes the unnormalised partial (max, sum, acc) rows at index `split`, laid out
    [B, Hq, num_splits(, D)] with stride s_ps between splits, for reduce_splits_kernel.
    With SLIDING the query sees the last `window` tokens only; tiles wholly before them are skipped,
    so a split that lies before the window reads nothing and weighs 0 in the reduce. (A constexpr, so
    full attention compiles to the kernel it was: the window's bounds cost registers and occupancy.)
    """
    seq = tl.program_id(0).to(tl.int64)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + seq)
    start = split * tokens_per_split
    end = tl.minimum(seq_len, start + tokens_per_split)
    lo = 0
    if SLIDING:
        lo = tl.maximum(seq_len - window, 0)
        # Split ranges start on whole tiles, so starting at lo's tile keeps every tile aligned.
        start = tl.maximum(start, lo // BLOCK_N * BLOCK_N)

    g = tl.arange(0, GROUP_PAD)
    d = tl.arange(0, HEAD_DIM)
    heads = kv_head * GROUP + g
    g_mask = g < GROUP
    q = tl.load(_row_ptrs(q_ptr, seq * s_qb + heads * s_qh, HEAD_DIM), mask=g_mask[:, None], other=0.0)

    m_i = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_DIM], tl.float32)
    table = table_ptr + seq * s_bt
    for tile in range(start, end, BLOCK_N):
        n = tile + tl.arange(0, BLOCK_N)
        n_mask = n < end
        if SLIDING:
            n_mask = n_mask & (n >= lo)
        k = _load_kv_tile(k_cache_ptr, table, n, n_mask, kv_head, s_kb, s_kt, s_kh, HEAD_DIM, BLOCK_SIZE)
        v = _load_kv_tile(v_cache_ptr, table, n, n_mask, kv_head, s_vb, s_vt, s_vh, HEAD_DIM, BLOCK_SIZE)
        m_i, l_i, acc = online_softmax_step(q, k, v, n_mask[None, :], m_i, l_i, acc, qk_scale, DOT_PRECISION)

    if SPLIT:
        row = seq * s_ob + heads * s_oh + split * s_ps
        tl.store(part_m_ptr + row, m_i, mask=g_mask)
        tl.store(part_l_ptr + row, l_i, mask=g_mask)
        tl.store(out_ptr + row[:, None] * HEAD_DIM + d[None, :], acc, mask=g_mask[:, None])
    else:
        out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        dst = _row_ptrs(out_ptr, seq * s_ob + heads * s_oh, HEAD_DIM)
        tl.store(dst, out.to(out_ptr.dtype.element_ty), mask=g_mask[:, None])


@triton.jit
def reduce_splits_kernel(
    part_acc_ptr,
    part_m_ptr,
    part_l_ptr,
    out_ptr,
    num_splits,
    s_ob,
    s_oh,
    HEAD_DIM: tl.constexpr,
    SPLITS_PAD: tl.constexpr,
):
    """Program (seq, q_head): merge the split partials, rescaling each by exp2(m_split - m_max).

    Partials are contiguous [B, Hq, num_splits(, D)]. A split past the end of a short request has
    m = -inf and l = 0 and so weighs 0.
    """
    seq = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    num_heads = tl.num_programs(1)
    s = tl.arange(0, SPLITS_PAD)
    d = tl.arange(0, HEAD_DIM)
    s_mask = s < num_splits
    row = (seq * num_heads + head) * num_splits + s
    m = tl.load(part_m_ptr + row, mask=s_mask, other=float("-inf"))
    l = tl.load(part_l_ptr + row, mask=s_mask, other=0.0)
    acc = tl.load(part_acc_ptr + row[:, None] * HEAD_DIM + d[None, :], mask=s_mask[:, None], other=0.0)
    m_max = tl.max(m, 0)
    w = tl.exp2(m - tl.where(m_max == float("-inf"), 0.0, m_max))
    total = tl.sum(w * l, 0)
    out = tl.sum(w[:, None] * acc, 0) / tl.where(total > 0, total, 1.0)
    tl.store(out_ptr + seq * s_ob + head * s_oh + d, out.to(out_ptr.dtype.element_ty))


@triton.jit
def prefill_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    table_ptr,
    query_start_loc_ptr,
    seq_lens_ptr,
    out_ptr,
    qk_scale,
    window,
    s_qt,
    s_qh,
    s_ot,
    s_oh,
    s_bt,
    s_kb,
    s_kt,
    s_kh,
    s_vb,
    s_vt,
    s_vh,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    SLIDING: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """Program (request, query tile, q_head): BLOCK_M new tokens attend causally over the cache.

    The request's q_len new tokens are the last ones of its seq_len-token context (already stored),
    so new token i sits at position seq_len - q_len + i and sees keys 0 ..= that position: the
    cached prefix and the chunk itself, all read through the block table. With SLIDING it sees only
    keys past position - window.
    """
    req = tl.program_id(0)
    tile = tl.program_id(1)
    head = tl.program_id(2)
    q_start = tl.load(query_start_loc_ptr + req)
    q_len = tl.load(query_start_loc_ptr + req + 1) - q_start
    if tile * BLOCK_M >= q_len:
        return
    seq_len = tl.load(seq_lens_ptr + req)
    prefix_len = seq_len - q_len

    i = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    i_mask = i < q_len
    tokens = (q_start + i).to(tl.int64)
    pos = prefix_len + i
    q = tl.load(_row_ptrs(q_ptr, tokens * s_qt + head * s_qh, HEAD_DIM), mask=i_mask[:, None], other=0.0)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    kv_head = head // GROUP
    table = table_ptr + req.to(tl.int64) * s_bt
    # Keys past this tile's last position are masked for every row: stop before them. With a window,
    # keys before its first row's window are masked for every row too: start after them.
    end = tl.minimum(seq_len, prefix_len + (tile + 1) * BLOCK_M)
    lo = 0
    if SLIDING:
        lo = tl.maximum(prefix_len + tile * BLOCK_M - window + 1, 0)
    for start in range(lo // BLOCK_N * BLOCK_N, end, BLOCK_N):
        n = start + tl.arange(0, BLOCK_N)
        n_mask = n < end
        k = _load_kv_tile(k_cache_ptr, table, n, n_mask, kv_head, s_kb, s_kt, s_kh, HEAD_DIM, BLOCK_SIZE)
        v = _load_kv_tile(v_cache_ptr, table, n, n_mask, kv_head, s_vb, s_vt, s_vh, HEAD_DIM, BLOCK_SIZE)
        causal = (n[None, :] <= pos[:, None]) & n_mask[None, :]
        if SLIDING:
            causal = causal & (n[None, :] > pos[:, None] - window)
        m_i, l_i, acc = online_softmax_step(q, k, v, causal, m_i, l_i, acc, qk_scale, DOT_PRECISION)

    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    tl.store(
        _row_ptrs(out_ptr, tokens * s_ot + head * s_oh, HEAD_DIM),
        out.to(out_ptr.dtype.element_ty),
        mask=i_mask[:, None],
    )


def prefill_num_warps(head_dim: int) -> int:
    """A [BLOCK_M, head_dim] fp32 accumulator spread over 4 warps is 64 registers a thread at d128,
    and with the q tile and scores it spilled on sm_80 (bench/results/kernels_offline.json): 8 warps
    halve it."""
    return NUM_WARPS * 2 if head_dim >= 128 else NUM_WARPS


def tiles(capability: tuple[int, int] | None) -> tuple[int, int, int]:
    """(decode BLOCK_N, prefill BLOCK_M, prefill BLOCK_N) on a CUDA device of this compute capability
    (None: a CPU tensor, run by the interpreter): the narrower TURING_* tiles below 8.0, where tl.dot
    runs on CUDA cores, and the tensor-core tiles from 8.0 on."""
    if capability is not None and capability < (8, 0):
        return TURING_DECODE_BLOCK_N, TURING_PREFILL_BLOCK_M, TURING_PREFILL_BLOCK_N
    return DECODE_BLOCK_N, PREFILL_BLOCK_M, PREFILL_BLOCK_N


def _tiles_for(x: torch.Tensor) -> tuple[int, int, int]:
    return tiles(_capability(x.device.index) if x.is_cuda else None)


@functools.cache
def _capability(device_index: int) -> tuple[int, int]:
    # Asked by every eager attention call of every layer; a device's capability never changes.
    return torch.cuda.get_device_capability(device_index)


def _dot_precision(dtype: torch.dtype) -> str:
    # fp32 tests compare at 1e-4; tf32 (the GPU default for fp32 dots) keeps only 10 mantissa bits.
    return "ieee" if dtype == torch.float32 else "tf32"


def _window(sliding_window: int | None) -> int:
    """The kernels' window argument, which only SLIDING kernels read."""
    return 0 if sliding_window is None else sliding_window


def _rows_aligned(x: torch.Tensor) -> bool:
    """What _row_ptrs promises the compiler: contiguous rows at 16-byte aligned offsets."""
    size = x.element_size()
    return x.stride(-1) == 1 and x.data_ptr() % 16 == 0 and all(s * size % 16 == 0 for s in x.stride()[:-1])


def _check_cache(k_cache: torch.Tensor, v_cache: torch.Tensor) -> None:
    assert k_cache.shape == v_cache.shape and _rows_aligned(k_cache) and _rows_aligned(v_cache), (
        "caches need a contiguous last dim and 16-byte aligned rows"
    )
    block_size, head_dim = k_cache.shape[1], k_cache.shape[3]
    assert is_pow2(block_size, 8), "block_size must be a power of two >= 8"
    assert is_pow2(head_dim, 16), "head_dim must be a power of two >= 16"


def aligned16(x: torch.Tensor) -> torch.Tensor:
    return x if _rows_aligned(x) else x.clone(memory_format=torch.contiguous_format)


def store_kvcache(
    k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """Write k, v ([T, Hkv, D]) at flat slots slot_mapping ([T]) of the caches; slots of -1 are skipped."""
    _check_cache(k_cache, v_cache)
    num_tokens, num_kv_heads, head_dim = k.shape
    if num_tokens == 0:
        return
    k, v = aligned16(k), aligned16(v)
    store_kernel[(num_tokens,)](
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
        *v_cache.stride()[:3],
        num_kv_heads,
        HEADS_PAD=triton.next_power_of_2(num_kv_heads),
        HEAD_DIM=head_dim,
        BLOCK_SIZE=k_cache.shape[1],
    )


def choose_num_splits(num_seqs: int, num_kv_heads: int, max_context_len: int, num_sms: int) -> int:
    """How many programs share one (seq, kv_head) in decode (1 = no split-K).

    Decode runs one program per (seq, kv_head), each streaming that head's whole context. With few
    programs per SM, SMs idle (B*Hkv = 8 on 132 SMs) or the last wave runs part-full, and bandwidth
    drops. So when B*Hkv < PROGRAMS_PER_SM * num_sms, cut each context into ranges of at least
    MIN_SPLIT_TOKENS tokens until the grid has about that many programs (at most MAX_SPLITS). A split
    costs one fp32 partial row per query head and a small reduce launch, next to MIN_SPLIT_TOKENS
    tokens of K and V per program.
    """
    programs = num_seqs * num_kv_heads
    wanted = math.ceil(PROGRAMS_PER_SM * num_sms / max(programs, 1))
    return max(1, min(wanted, max_context_len // MIN_SPLIT_TOKENS, MAX_SPLITS))


def default_num_splits(q: torch.Tensor, k_cache: torch.Tensor, block_tables: torch.Tensor) -> int:
    """paged_decode's split-K factor when none is given. The context bound is the block table's
    width (block_tables.shape[1] * block_size), so the choice needs no device sync."""
    if not q.is_cuda:
        return 1  # the interpreter runs programs one by one: splitting only adds work
    num_sms = torch.cuda.get_device_properties(q.device).multi_processor_count
    return choose_num_splits(q.shape[0], k_cache.shape[2], block_tables.shape[1] * k_cache.shape[1], num_sms)


def paged_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    *,
    num_splits: int | None = None,
    block_n: int | None = None,
    sliding_window: int | None = None,
) -> torch.Tensor:
    """One query token per request: q [B, Hq, D] over its seq_lens[b] cached tokens -> [B, Hq, D]
    (over the last sliding_window of them, when given).

    num_splits=None picks the split-K factor with default_num_splits; num_splits=1 is the plain
    kernel; > 1 forces split-K (flash-decoding) with a reduce kernel. block_n=None takes the device's
    tile (`tiles`).
    """
    _check_cache(k_cache, v_cache)
    block_n = block_n or _tiles_for(q)[0]
    assert is_pow2(block_n, DOT_MIN), "block_n must be a power of two >= 16"
    num_seqs, num_heads, head_dim = q.shape
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    q = aligned16(q)
    out = torch.empty_like(q)
    if num_seqs == 0:
        return out
    group = num_heads // num_kv_heads
    max_context = block_tables.shape[1] * block_size
    num_splits = num_splits or default_num_splits(q, k_cache, block_tables)
    # Round each split to whole tiles so that only the last tile of a range is partial.
    tokens_per_split = triton.cdiv(triton.cdiv(max_context, num_splits), block_n) * block_n
    num_splits = triton.cdiv(max_context, tokens_per_split)
    split = num_splits > 1
    if split:
        part_acc = torch.empty(num_seqs, num_heads, num_splits, head_dim, device=q.device, dtype=torch.float32)
        part_m = torch.empty(num_seqs, num_heads, num_splits, device=q.device, dtype=torch.float32)
        part_l = torch.empty_like(part_m)
        dst, s_b, s_h, s_s = part_acc, part_m.stride(0), part_m.stride(1), part_m.stride(2)
    else:
        part_m = part_l = dst = out
        s_b, s_h, s_s = out.stride(0), out.stride(1), 0
    decode_kernel[(num_seqs, num_kv_heads, num_splits)](
        q,
        k_cache,
        v_cache,
        block_tables,
        seq_lens,
        dst,
        part_m,
        part_l,
        scale * math.log2(math.e),
        tokens_per_split,
        _window(sliding_window),
        q.stride(0),
        q.stride(1),
        s_b,
        s_h,
        s_s,
        block_tables.stride(0),
        *k_cache.stride()[:3],
        *v_cache.stride()[:3],
        GROUP=group,
        GROUP_PAD=max(DOT_MIN, triton.next_power_of_2(group)),
        HEAD_DIM=head_dim,
        BLOCK_SIZE=block_size,
        BLOCK_N=block_n,
        SPLIT=split,
        SLIDING=sliding_window is not None,
        DOT_PRECISION=_dot_precision(q.dtype),
        num_warps=NUM_WARPS,
        num_stages=NUM_STAGES,
    )
    if split:
        reduce_splits_kernel[(num_seqs, num_heads)](
            part_acc,
            part_m,
            part_l,
            out,
            num_splits,
            out.stride(0),
            out.stride(1),
            HEAD_DIM=head_dim,
            SPLITS_PAD=triton.next_power_of_2(num_splits),
            num_warps=NUM_WARPS,
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
    *,
    block_m: int | None = None,
    block_n: int | None = None,
    sliding_window: int | None = None,
) -> torch.Tensor:
    """Chunks of new tokens (already stored) attend causally to their cached prefix and themselves.

    q [T, Hq, D] -> [T, Hq, D]; request i owns rows query_start_loc[i]:query_start_loc[i+1] and has
    seq_lens[i] tokens of context including them. The grid covers max_query_len for every request;
    tiles past a shorter request's chunk exit at once. A tile left None is the device's (`tiles`).
    """
    _check_cache(k_cache, v_cache)
    _, default_m, default_n = _tiles_for(q)
    block_m, block_n = block_m or default_m, block_n or default_n
    assert is_pow2(block_m, DOT_MIN) and is_pow2(block_n, DOT_MIN), "tiles must be powers of two >= 16"
    num_tokens, num_heads, head_dim = q.shape
    q = aligned16(q)
    out = torch.empty_like(q)
    num_reqs = seq_lens.shape[0]
    if num_tokens == 0 or num_reqs == 0:
        return out
    group = num_heads // k_cache.shape[2]
    prefill_kernel[(num_reqs, triton.cdiv(max_query_len, block_m), num_heads)](
        q,
        k_cache,
        v_cache,
        block_tables,
        query_start_loc,
        seq_lens,
        out,
        scale * math.log2(math.e),
        _window(sliding_window),
        q.stride(0),
        q.stride(1),
        out.stride(0),
        out.stride(1),
        block_tables.stride(0),
        *k_cache.stride()[:3],
        *v_cache.stride()[:3],
        GROUP=group,
        HEAD_DIM=head_dim,
        BLOCK_SIZE=k_cache.shape[1],
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        SLIDING=sliding_window is not None,
        DOT_PRECISION=_dot_precision(q.dtype),
        num_warps=prefill_num_warps(head_dim),
        num_stages=NUM_STAGES,
    )
    return out
