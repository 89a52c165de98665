"""Chapter 01 exercises: what the KV cache costs in bytes, and attention over it.

Check your work with:   make grade CH=01
"""

from __future__ import annotations

import torch


def kv_bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, dtype_bytes: int) -> int:
    """Task 01.1: the bytes one token's keys and values take, summed over every layer.

    Each layer stores one K vector and one V vector per KV head, each head_dim numbers of dtype_bytes.
    Query heads do not appear: only K and V are cached.

    Hints:
    - SmolLM2 in fp32 (30 layers, 3 KV heads, head_dim 64, 4 bytes) takes 46,080 bytes per token.
    - Don't forget the factor for K *and* V.
    """
    raise NotImplementedError


def kv_bytes_per_block(block_size: int, num_layers: int, num_kv_heads: int, head_dim: int, dtype_bytes: int) -> int:
    """Task 01.2: the bytes one KV block of block_size tokens takes, across all layers.

    Hints: reuse kv_bytes_per_token. Llama-70B (80 layers, 8 KV heads, head_dim 128) in fp16 with
    16-token blocks gives 5,242,880 bytes: 5.24 MB in powers of ten, exactly 5 MiB in powers of two.
    """
    raise NotImplementedError


def max_cached_tokens(budget_bytes: int, block_size: int, bytes_per_token: int) -> int:
    """Task 01.3: how many tokens a KV pool carved out of budget_bytes can hold.

    The pool is made of whole blocks (block_size tokens each); a leftover smaller than one block is
    wasted. Block 0 is the null block: it is allocated but never holds a real token, so it does not
    count. A budget that gives fewer than two blocks cannot serve anything: raise MemoryError.

    Hints:
    - Integer division, twice: bytes per block, then blocks in the budget.
    - The engine's default CPU budget, 512 MiB, holds 11,632 SmolLM2 tokens in fp32.
    """
    raise NotImplementedError


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> torch.Tensor:
    """Task 01.4: one new token attends over everything in the cache (a decode step).

    q:       [num_heads, head_dim], the new token's queries (RoPE already applied)
    k_cache: [seq_len, num_kv_heads, head_dim], keys of every token so far, the new one included
    v_cache: [seq_len, num_kv_heads, head_dim]
    returns: [num_heads, head_dim] in q's dtype.

    Grouped-query attention: num_heads is a multiple of num_kv_heads, and query head h reads KV head
    h // (num_heads // num_kv_heads), so consecutive query heads share a KV head. Scores are scaled by
    1 / sqrt(head_dim). No mask is needed: a decode token may see every cached token.

    Hints:
    - k_cache.repeat_interleave(group, dim=1) gives each query head its own copy of its KV head.
    - scores[h, s] = q[h] . k[s, h] * scale; softmax over s; out[h] = sum_s p[h, s] * v[s, h].
    - torch.einsum("hd,shd->hs", ...) and torch.softmax keep it short (and softmax is overflow-safe).
    """
    raise NotImplementedError
