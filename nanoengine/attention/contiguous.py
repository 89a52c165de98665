"""One request's K/V in one preallocated buffer: the KV cache before paging.

This is how a naive server keeps KV: reserve max_len slots per request up front. It is correct and
simple, and it wastes memory: every slot past the request's real length is
reserved but never used, which is the fragmentation that paging removes.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from nanoengine.attention.backend import causal_mask
from nanoengine.config import LlamaConfig


class ContiguousKVCache:
    """K and V for one sequence: [num_layers, max_len, num_kv_heads, head_dim] each.

    Invariant: positions [0, num_tokens) hold valid K/V. A call appends the new tokens at
    positions [num_tokens, num_tokens + T) and, after the last layer, `advance(T)` commits them.
    """

    def __init__(self, config: LlamaConfig, max_len: int, device="cpu", dtype=torch.float32):
        shape = (config.num_hidden_layers, max_len, config.num_key_value_heads, config.head_dim)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        self.max_len = max_len
        self.num_tokens = 0
        self.windows = [config.window(i) for i in range(config.num_hidden_layers)]

    def __call__(self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        start, t = self.num_tokens, q.shape[0]
        if start + t > self.max_len:
            raise ValueError(f"contiguous cache holds {self.max_len} tokens; asked for {start + t}")
        self.k[layer_idx, start : start + t] = k
        self.v[layer_idx, start : start + t] = v
        keys = self.k[layer_idx, : start + t].transpose(0, 1)  # [Hkv, S, D]
        values = self.v[layer_idx, : start + t].transpose(0, 1)
        # Query i sits at position start+i and may see keys 0..start+i (a bottom-right causal mask), or
        # the last W of them in a sliding layer; one query with no window sees everything (no mask).
        window = self.windows[layer_idx]
        mask = None if t == 1 and window is None else causal_mask(t, start + t, window, q.device)
        causal = mask is None and t > 1  # no cached prefix: the top-left causal mask is the same one
        out = F.scaled_dot_product_attention(
            q.transpose(0, 1), keys, values, attn_mask=mask, is_causal=causal, enable_gqa=True
        )
        return out.transpose(0, 1)

    def advance(self, num_new_tokens: int) -> None:
        self.num_tokens += num_new_tokens
