"""The paged KV cache the engine runs on: one K and one V pool per layer, shared by all requests."""

from __future__ import annotations

import torch

from nanoengine.attention.backend import AttentionBackend, AttentionMetadata
from nanoengine.config import LlamaConfig
from nanoengine.kv_cache_interface import KVCacheGroupSpec, get_kv_cache_groups, num_layer_slots


class PagedKVCache:
    """K/V pools of [num_blocks, block_size, num_kv_heads, head_dim] per layer slot, and the backend.

    The model calls it as `attn(layer_idx, q, k, v)`. The runner sets `metadata` before each
    forward pass; the call stores the new k/v at their slots, then runs the decode kernel on the
    leading one-token requests and the prefill kernel on the rest.

    A model with one KV cache group has one slot per layer and one `metadata`. A hybrid model's
    groups (core.get_kv_cache_groups) share the slots: layer slot i of every group is one tensor, and
    a block id belongs to one group at a time. The runner then sets `group_metadata`, one per group,
    each with that group's block tables and slot mapping; `metadata` is group 0's.
    """

    def __init__(
        self,
        config: LlamaConfig,
        num_blocks: int,
        block_size: int,
        backend: AttentionBackend,
        device="cpu",
        dtype=torch.float32,
        groups: list[KVCacheGroupSpec] | None = None,
    ):
        self.groups = groups or kv_cache_groups(config)
        shape = (num_blocks, block_size, config.num_key_value_heads, config.head_dim)
        num_slots = num_layer_slots(self.groups)
        self.k_caches = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(num_slots)]
        self.v_caches = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(num_slots)]
        self.layer_group = [0] * config.num_hidden_layers
        self.layer_slot = list(range(config.num_hidden_layers))
        for group_id, group in enumerate(self.groups):
            for slot, layer in enumerate(group.layer_ids):
                self.layer_group[layer], self.layer_slot[layer] = group_id, slot
        self.num_blocks, self.block_size = num_blocks, block_size
        self.backend = backend
        self.scale = config.head_dim**-0.5
        # Only sliding layers pass a window, so a full-attention backend needs no such argument.
        self.windows = [
            {} if config.window(i) is None else {"sliding_window": config.window(i)}
            for i in range(config.num_hidden_layers)
        ]
        self.group_metadata: list[AttentionMetadata] = []

    @property
    def metadata(self) -> AttentionMetadata | None:
        return self.group_metadata[0] if self.group_metadata else None

    @metadata.setter
    def metadata(self, metadata: AttentionMetadata) -> None:
        self.group_metadata = [metadata]

    def __call__(self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        md, be = self.group_metadata[self.layer_group[layer_idx]], self.backend
        slot = self.layer_slot[layer_idx]
        kc, vc = self.k_caches[slot], self.v_caches[slot]
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
        out[nd:] = be.prefill(
            q[nd:], kc, vc, md.block_tables[nd:], qsl, md.seq_lens[nd:], md.max_query_len, self.scale, **window
        )
        return out

    @staticmethod
    def bytes_per_block(
        config: LlamaConfig, block_size: int, dtype: torch.dtype, groups: list[KVCacheGroupSpec] | None = None
    ) -> int:
        """One block id's memory: block_size tokens in every layer slot (all layers, for one group).
        groups: the model's KV cache groups, where the caller has them already."""
        per_token_per_layer = (
            config.kv_bytes_per_token(torch.empty((), dtype=dtype).element_size()) // config.num_hidden_layers
        )
        return block_size * num_layer_slots(groups or kv_cache_groups(config)) * per_token_per_layer


def kv_cache_groups(config: LlamaConfig, draft_config: LlamaConfig | None = None) -> list[KVCacheGroupSpec]:
    """The model's KV cache groups: one for a model with one attention type, several for a hybrid. draft_config:
    an EAGLE head's, whose layers flag the groups they join (get_kv_cache_groups' draft_windows)."""

    def windows(c: LlamaConfig | None) -> list[int | None]:
        return [] if c is None else [c.window(i) for i in range(c.num_hidden_layers)]

    return get_kv_cache_groups(windows(config), windows(draft_config))
