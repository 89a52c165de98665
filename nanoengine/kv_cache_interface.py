"""Which layers share a block table: KV cache groups (vllm/v1/kv_cache_interface.py, core/kv_cache_planning.py).

A full-attention layer needs every token's KV; a sliding layer with window W needs only the last W.
Layers of one attention type can share block tables, layers of two types cannot, so a hybrid model's
layers are split into groups, each with its own block table per request. All groups draw blocks from
one pool, so a block must cost the same memory in every group: each group has the same number of layer
slots (a group short of layers leaves a slot unused), and a block id addresses one page in each slot.
Layer slot i of every group is one tensor; a block id belongs to one group at a time, so the groups
never write the same page.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class KVCacheGroupSpec:
    """The layers (model layer indices, in slot order) that share one block table, and their window.

    sliding_window is None for full attention. Groups of one model all have the same block size.
    is_eagle_group (vLLM 0.33's field): the group holds an EAGLE drafter's layers, so a prefix hit drops its last
    block in this group and searches one block further first (KVCacheCoordinator.eagle_group_ids).
    """

    layer_ids: tuple[int, ...]
    sliding_window: int | None = None
    is_eagle_group: bool = False

    def max_admission_blocks_per_request(self, block_size: int, max_in_flight_tokens: int, max_model_len: int) -> int:
        """The most blocks a request holds at once in a sliding group (vLLM 0.33's
        SlidingWindowSpec.max_admission_blocks_per_request): the W - 1 computed tokens the next query sees, plus the
        tokens of the steps in flight (max_in_flight_tokens: one budget per step not yet settled), never more than
        max_model_len, and one block more since the window may start inside a block (W = 4, block_size 4: the window
        [C D E F] of a 6-token request spans [x x C D][E F]). Admission reserves at most this many blocks for the
        group (KVCacheManager.allocate_slots with full_sequence_must_fit), since remove_skipped_blocks frees those
        behind the window before each chunk's allocation. Only a sliding group has the cap; ValueError for full
        attention, which holds every block until the request finishes."""
        if self.sliding_window is None:
            raise ValueError("max_admission_blocks_per_request: full attention has no cap; ask a sliding group.")
        num_tokens = min(self.sliding_window - 1 + max_in_flight_tokens, max_model_len)
        return -(-num_tokens // block_size) + 1


@dataclass(frozen=True, slots=True, kw_only=True)
class KVCacheConfig:
    """The KV cache as sized for one engine (vLLM's KVCacheConfig): num_blocks block ids, the null block
    included, shared by every group; one block id addresses a page in each of the groups' layer slots."""

    num_blocks: int
    kv_cache_groups: tuple[KVCacheGroupSpec, ...]


def get_kv_cache_groups(
    windows: Sequence[int | None], draft_windows: Sequence[int | None] = ()
) -> list[KVCacheGroupSpec]:
    """Group layers by their window (None: full attention), full attention first.

    One attention type: one group of every layer, so a block holds the KV of all layers, as before
    hybrid models existed. Several: vLLM's layout for models whose layers have the same page size
    (_get_kv_cache_groups_uniform_page_size). The group size is the smallest type's layer count, or
    the largest when that is under 1.5 times the smallest; each type's layers are dealt round-robin
    (layers[i::num_groups]) into groups of at most that size. vLLM keeps the groups in the order their
    type first appears in the layers (its coordinator then searches full attention first) and merges
    specs that can share a layout (full-attention specs differing only in a window or chunk size); here
    full attention comes first and each window is a type of its own. For 3 sliding and 1 full layer that is
    four groups of one layer: a block holds one layer's KV, and a sliding group gives its blocks back
    as the window moves on.

    draft_windows: an EAGLE drafter's layers, numbered after the target's. As in vLLM 0.33 (a spec's is_draft is
    left out of its equality, kv_cache_interface.py), they join the target's layers of their type and are dealt
    with them, and each group that receives one is flagged is_eagle_group (kv_cache_planning.py): a full-attention
    head on a full + sliding model flags the full group alone. Their ids are left out of layer_ids, since
    nanoengine's drafter keeps its KV in a cache of its own, addressed by the same block ids.
    """
    num_target_layers = len(windows)
    by_window: dict[int | None, list[int]] = {}
    for layer, window in enumerate([*windows, *draft_windows]):
        by_window.setdefault(window, []).append(layer)
    counts = [len(layers) for layers in by_window.values()]
    group_size = max(counts) if max(counts) < 1.5 * min(counts) else min(counts)
    groups = []
    for window in sorted(by_window, key=lambda w: (w is not None, w or 0)):
        layers = by_window[window]
        num_groups = -(-len(layers) // group_size)
        for i in range(num_groups):
            dealt = layers[i::num_groups]
            target = tuple(layer for layer in dealt if layer < num_target_layers)
            groups.append(KVCacheGroupSpec(target, window, is_eagle_group=len(target) < len(dealt)))
    return groups


def num_layer_slots(groups: Sequence[KVCacheGroupSpec]) -> int:
    """Layer slots per block: the largest group's layer count (a smaller group leaves slots unused)."""
    return max(len(group.layer_ids) for group in groups)
