"""Chapter 01 solutions: what the KV cache costs in bytes, and attention over it."""

from __future__ import annotations

import torch


def kv_bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, dtype_bytes: int) -> int:
    """Task 01.1: the bytes one token's keys and values take, summed over every layer."""
    return 2 * num_layers * num_kv_heads * head_dim * dtype_bytes  # 2: one K and one V


def kv_bytes_per_block(block_size: int, num_layers: int, num_kv_heads: int, head_dim: int, dtype_bytes: int) -> int:
    """Task 01.2: the bytes one KV block of block_size tokens takes, across all layers."""
    return block_size * kv_bytes_per_token(num_layers, num_kv_heads, head_dim, dtype_bytes)


def max_cached_tokens(budget_bytes: int, block_size: int, bytes_per_token: int) -> int:
    """Task 01.3: how many tokens a KV pool carved out of budget_bytes can hold."""
    num_blocks = budget_bytes // (block_size * bytes_per_token)
    if num_blocks < 2:
        raise MemoryError(f"{budget_bytes} bytes hold {num_blocks} blocks; the null block alone needs one")
    return (num_blocks - 1) * block_size


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> torch.Tensor:
    """Task 01.4: one new token attends over everything in the cache (a decode step)."""
    group = q.shape[0] // k_cache.shape[1]
    k = k_cache.repeat_interleave(group, dim=1).float()  # [S, Hq, D]
    v = v_cache.repeat_interleave(group, dim=1).float()
    scores = torch.einsum("hd,shd->hs", q.float(), k) * q.shape[-1] ** -0.5
    return torch.einsum("hs,shd->hd", scores.softmax(dim=-1), v).to(q.dtype)
