"""The paged KV cache the engine runs on: one K and one V pool per layer, shared by all requests."""

from __future__ import annotations

import torch

from nanoengine.attention.backend import AttentionBackend, AttentionMetadata
from nanoengine.config import LlamaConfig


class PagedKVCache:
    """K/V pools of [num_blocks, block_size, num_kv_heads, head_dim] per layer, and the backend.

    The model calls it as `attn(layer_idx, q, k, v)`. The runner sets `metadata` before each
    forward pass; the call stores the new k/v at their slots, then runs the decode kernel on the
    leading one-token requests and the prefill kernel on the rest.
    """

    def __init__(self, config: LlamaConfig, num_blocks: int, block_size: int, backend: AttentionBackend,
                 device="cpu", dtype=torch.float32):
        shape = (num_blocks, block_size, config.num_key_value_heads, config.head_dim)
        self.k_caches = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(config.num_hidden_layers)]
        self.v_caches = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(config.num_hidden_layers)]
        self.num_blocks, self.block_size = num_blocks, block_size
        self.backend = backend
        self.scale = config.head_dim ** -0.5
        # Only sliding layers pass a window, so a full-attention backend needs no such argument.
        self.windows = [{} if config.window(i) is None else {"sliding_window": config.window(i)}
                        for i in range(config.num_hidden_layers)]
        self.metadata: AttentionMetadata | None = None

    def __call__(self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        md, be = self.metadata, self.backend
        kc, vc = self.k_caches[layer_idx], self.v_caches[layer_idx]
        be.store_kvcache(k, v, kc, vc, md.slot_mapping)
        nd = md.num_decodes
        shared = md.num_common_prefix_blocks
        window = self.windows[layer_idx]
        if nd == md.seq_lens.shape[0]:
            return be.decode(q, kc, vc, md.block_tables, md.seq_lens, self.scale, shared, **window)
        out = torch.empty_like(q)
        if nd:
            out[:nd] = be.decode(q[:nd], kc, vc, md.block_tables[:nd], md.seq_lens[:nd], self.scale, shared, **window)
        qsl = md.query_start_loc[nd:] - nd
        out[nd:] = be.prefill(q[nd:], kc, vc, md.block_tables[nd:], qsl, md.seq_lens[nd:], md.max_query_len,
                              self.scale, **window)
        return out

    @staticmethod
    def bytes_per_block(config: LlamaConfig, block_size: int, dtype: torch.dtype) -> int:
        return block_size * config.kv_bytes_per_token(torch.empty((), dtype=dtype).element_size())
