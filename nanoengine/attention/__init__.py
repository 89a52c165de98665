"""The attention seam: the one place the model meets the KV cache.

The model calls `attn(layer_idx, q, k, v)` with the step's new tokens, flattened across requests:
q is [T, num_heads, head_dim], k and v are [T, num_kv_heads, head_dim], already rotated by RoPE.
The context stores k and v wherever its cache keeps them, attends each new query causally over its
own request's cached prefix plus the new tokens, and returns [T, num_heads, head_dim].

Implementations: `ContiguousKVCache` (one request, one preallocated buffer: the cache before
paging). The paged backends plug in through the same call.
"""

from typing import Protocol

import torch


class AttentionContext(Protocol):
    def __call__(self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor: ...


from nanoengine.attention.contiguous import ContiguousKVCache  # noqa: E402

__all__ = ["AttentionContext", "ContiguousKVCache"]
