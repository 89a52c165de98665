"""Every setting of one engine in one tree (vllm/config/vllm.py's VllmConfig), built by EngineArgs."""

from __future__ import annotations

from dataclasses import dataclass

from nanoengine.attention.backend import is_pow2
from nanoengine.attention.paged import kv_cache_groups
from nanoengine.config.cache import CacheConfig
from nanoengine.config.model import ModelConfig
from nanoengine.config.scheduler import SchedulerConfig
from nanoengine.config.speculative import SpeculativeConfig
from nanoengine.core.single_type_kv_cache_manager import FullAttentionManager
from nanoengine.errors import InvalidEngineArgumentError, UnsupportedModelError
from nanoengine.kv_cache_interface import KVCacheGroupSpec
from nanoengine.model.llama_eagle import EagleLlamaForCausalLM
from nanoengine.parts import EngineParts


@dataclass(slots=True, frozen=True, kw_only=True)
class EngineConfig:
    """The model, cache, scheduler and speculative settings, and the engine's parts, checked against each other
    once, here (as VllmConfig.__post_init__ checks its configs together).

    Each setting has one owner: block_size is cache_config's, max_model_len model_config's; num_lookahead_tokens,
    num_spec_tokens and max_num_new_slots_for_drafting speculative_config's. scheduler_config holds copies of all but
    block_size, so that a scheduler reads one config; this tree refuses copies that disagree with their owner.
    """

    model_config: ModelConfig
    cache_config: CacheConfig
    scheduler_config: SchedulerConfig
    parts: EngineParts
    speculative_config: SpeculativeConfig | None = None

    def __post_init__(self) -> None:
        block_size, max_model_len = self.cache_config.block_size, self.model_config.max_model_len
        if self.scheduler_config.max_model_len != max_model_len:
            raise ValueError("scheduler_config.max_model_len must be model_config.max_model_len")
        spec = self.speculative_config
        if self.scheduler_config.num_lookahead_tokens != (spec.num_lookahead_tokens if spec else 0):
            raise ValueError("scheduler_config.num_lookahead_tokens must be speculative_config's")
        if self.scheduler_config.num_spec_tokens != (spec.num_speculative_tokens if spec else 0):
            raise ValueError("scheduler_config.num_spec_tokens must be speculative_config's num_speculative_tokens")
        if self.scheduler_config.max_num_new_slots_for_drafting != (spec.max_num_new_slots_for_drafting if spec else 0):
            raise ValueError("scheduler_config.max_num_new_slots_for_drafting must be speculative_config's")
        budget = self.scheduler_config.max_num_batched_tokens
        if spec is not None and budget <= spec.num_lookahead_tokens:
            # vLLM's VllmConfig refuses it too: a draft model's slot a request would leave no token to schedule.
            raise InvalidEngineArgumentError(
                f"max_num_batched_tokens={budget} leaves no token to schedule beside the {spec.num_lookahead_tokens} "
                f'lookahead slots of speculative_config["method"]="{spec.method}". Give max_num_batched_tokens > '
                f"{spec.num_lookahead_tokens}, or fewer num_speculative_tokens.",
                parameter="max_num_batched_tokens",
                value=budget,
            )
        if spec is not None and budget < 1 + spec.num_speculative_tokens + spec.max_num_new_slots_for_drafting:
            # vLLM 0.33 accepts it, and then may stall: a newly admitted one-token request (a prefix hit of all but
            # one token) is padded to 1 + k and scheduled padded or not at all (Scheduler.padded_size).
            need = 1 + spec.num_speculative_tokens + spec.max_num_new_slots_for_drafting
            raise InvalidEngineArgumentError(
                f"max_num_batched_tokens={budget} cannot hold one request's padded step of {need} tokens (its token, "
                f"{spec.num_speculative_tokens} placeholder drafts and the drafter's slots): a request padded so is "
                f"scheduled whole or not at all, so the engine could stall. Give max_num_batched_tokens >= {need}.",
                parameter="max_num_batched_tokens",
                value=budget,
            )
        if self.parts.attention_backend.name == "triton" and not is_pow2(block_size, 8):
            raise InvalidEngineArgumentError(
                f"block_size must be a power of two >= 8 for the Triton kernels, got {block_size}. Use 8, 16 or 32, "
                "or attention_backend='torch', which takes any block size.",
                parameter="block_size",
                value=block_size,
            )
        windows = [g.sliding_window for g in self.kv_cache_groups if g.sliding_window]
        if windows and min(windows) < block_size:
            raise UnsupportedModelError(
                f"sliding_window={min(windows)} is below one block of {block_size} tokens. Blocks leave a window "
                "whole, so such a window would hold as many blocks as a window of one block; nanoengine serves "
                f"windows of at least one block. Use block_size <= {min(windows)}."
            )
        if windows and max(windows) > max_model_len:
            raise UnsupportedModelError(
                f"sliding_window={max(windows)} exceeds max_model_len={max_model_len}: no token could ever leave the "
                "window, so its layers are full attention. Give a smaller window, or full_attention layer types."
            )
        if spec is not None and spec.method != "ngram" and windows:
            raise InvalidEngineArgumentError(
                f'speculative_config["method"]="{spec.method}" serves full-attention models only: the draft\'s KV '
                "follows the target's one block table. Use a target without sliding windows, or n-gram drafts.",
                parameter="speculative_config",
                value=spec,
            )
        cls = self.parts.full_attention_manager_cls
        if (
            spec is not None
            and spec.use_eagle()
            and cls.find_longest_cache_hit is not FullAttentionManager.find_longest_cache_hit
        ):
            raise InvalidEngineArgumentError(
                f"{cls.__name__}.find_longest_cache_hit is not the engine's, and EAGLE drafts need it to drop the "
                'last hit block when use_eagle is set. With speculative_config["method"]="eagle", leave '
                "full_attention_manager_cls out.",
                parameter="full_attention_manager_cls",
                value=cls,
            )

    @property
    def kv_cache_groups(self) -> tuple[KVCacheGroupSpec, ...]:
        """The model's KV cache groups: one for a model with one attention type, several for a hybrid. With an
        EAGLE head, the groups its layers join are flagged is_eagle_group (vLLM 0.33's get_global_kv_cache_groups
        flags them when use_eagle_block_drop()); a head the worker will refuse flags none, which KVCacheCoordinator
        reads as every group."""
        head = self.speculative_config.model if self.speculative_config is not None and self.use_eagle else None
        draft_config = head.config if isinstance(head, EagleLlamaForCausalLM) else None
        return tuple(kv_cache_groups(self.model_config.hf_config, draft_config))

    @property
    def use_eagle(self) -> bool:
        """Whether a prefix hit drops its last block for an EAGLE head (vLLM's Scheduler passes
        SpeculativeConfig.use_eagle_block_drop() to its KVCacheManager as use_eagle)."""
        return self.speculative_config is not None and self.speculative_config.use_eagle()
