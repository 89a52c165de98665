"""Stand-ins for vLLM's config classes: what vLLM's Scheduler and KVCacheManager read of a VllmConfig, as plain
objects holding the values vLLM's own configs (and their properties) give for a CPU run of the graduation's
workloads. Each class and attribute is named as in the wheel's vllm/config/ (tests/course/test_graduation.py checks
every one there); anything else read fails naming the attribute.
"""

from __future__ import annotations

from typing import Any

# (the real module, the class) each stand-in stands for; the test reads them from the wheel.
REAL_CLASSES = {
    "VllmConfig": "vllm/config/vllm.py",
    "SchedulerConfig": "vllm/config/scheduler.py",
    "CacheConfig": "vllm/config/cache.py",
    "ModelConfig": "vllm/config/model.py",
    "ParallelConfig": "vllm/config/parallel.py",
    "ObservabilityConfig": "vllm/config/observability.py",
    "SpeculativeConfig": "vllm/config/speculative.py",
    "EncoderCacheManagerConfig": "vllm/config/ec_manager_config.py",
    "AuxOutputConfig": "vllm/config/aux_output.py",
}


class _Config:
    """Attributes as given; reading any other fails, naming the class and the attribute, so that a path of vLLM's
    that reads more config than the stand-in holds is caught rather than answered with a guess."""

    def __init__(self, **values: Any) -> None:
        self.__dict__.update(values)

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(
            f"vLLM read {type(self).__name__}.{name}, which nanocourse/graduation/config.py's stand-in does not "
            "hold: add it there with the value vLLM's config gives"
        )


class SchedulerConfig(_Config):
    pass


class CacheConfig(_Config):
    pass


class ModelConfig(_Config):
    pass


class ParallelConfig(_Config):
    pass


class ObservabilityConfig(_Config):
    pass


class SpeculativeConfig(_Config):
    def use_eagle(self) -> bool:
        return self.method == "eagle"

    def use_eagle_block_drop(self) -> bool:
        return self.needs_eagle_block_drop() and not self.disable_eagle_block_drop

    def needs_eagle_block_drop(self) -> bool:
        return self.method == "eagle"  # EAGLE-1: a position's draft KV depends on the next token


class EncoderCacheManagerConfig(_Config):
    def get_encoder_cache_manager_obj(self) -> None:
        return None


class AuxOutputConfig(_Config):
    pass


class VllmConfig(_Config):
    pass


def vllm_config(
    *,
    num_blocks: int,
    block_size: int,
    max_num_batched_tokens: int,
    max_num_seqs: int,
    policy: str,
    long_prefill_token_threshold: int,
    enable_prefix_caching: bool,
    max_model_len: int,
    long_prefill_token_threshold_adaptive: bool = False,
    num_speculative_tokens: int = 0,
    drafter: str | None = None,
    async_scheduling: bool = False,
) -> VllmConfig:
    """A VllmConfig of one decoder-only text model, synchronous scheduling (one batch in flight) unless
    async_scheduling (two, as VllmConfig.max_concurrent_batches gives it), no connector, no LoRA, no metrics
    collection; drafter: None, "ngram" (no lookahead slots), "draft_model" or "eagle" (one lookahead slot per
    draft, as VllmConfig.num_lookahead_tokens gives for both; EAGLE-1 drafts one token a pass, so it is not
    parallel drafting)."""
    speculative = (
        None
        if drafter is None
        else SpeculativeConfig(
            method=drafter,
            num_speculative_tokens=num_speculative_tokens,
            num_speculative_tokens_per_batch_size=None,
            disable_eagle_block_drop=False,
            # SpeculativeConfig.max_num_new_slots_for_drafting: an n-gram drafter and sequential EAGLE add no rows
            # to the target's batch; a draft model keeps one unsliced input token.
            max_num_new_slots_for_drafting=1 if drafter == "draft_model" else 0,
        )
    )
    return VllmConfig(
        scheduler_config=SchedulerConfig(
            max_num_batched_tokens=max_num_batched_tokens,
            max_num_seqs=max_num_seqs,
            max_num_active_seqs=None,
            max_num_scheduled_tokens=None,
            policy=policy,
            long_prefill_token_threshold=long_prefill_token_threshold,
            long_prefill_token_threshold_adaptive=long_prefill_token_threshold_adaptive,
            enable_chunked_prefill=True,
            disable_chunked_mm_input=False,
            scheduler_reserve_full_isl=True,
            watermark=0.0,
            prefill_schedule_interval=1,
            async_scheduling=async_scheduling,
        ),
        cache_config=CacheConfig(
            block_size=block_size,
            num_gpu_blocks=num_blocks,
            enable_prefix_caching=enable_prefix_caching,
            enable_mamba_shared_prefix_checkpoint=False,
            mamba_cache_mode="none",
            # CacheConfig's default: sliding groups cache only the blocks a later hit can reach (sparse retention).
            prefix_cache_retention_interval=0,
        ),
        model_config=ModelConfig(
            max_model_len=max_model_len,
            uses_mrope=False,
            is_encoder_decoder=False,
            runner_type="generate",
            is_diffusion=False,
            supports_multimodal_inputs=False,
            return_sampling_mask=False,
        ),
        parallel_config=ParallelConfig(
            pipeline_parallel_size=1,
            data_parallel_size=1,
            data_parallel_index=0,
            decode_context_parallel_size=1,
            prefill_context_parallel_size=1,
        ),
        observability_config=ObservabilityConfig(
            per_request_spec_decode_metrics=False,
            kv_cache_metrics=False,
            kv_cache_metrics_sample=0.01,
            enable_logging_iteration_details=False,
            enable_mfu_metrics=False,
        ),
        speculative_config=speculative,
        ec_manager_config=EncoderCacheManagerConfig(),
        aux_output_config=AuxOutputConfig(enabled=False),
        lora_config=None,
        kv_events_config=None,
        kv_transfer_config=None,
        ec_transfer_config=None,
        is_mm_encoder_only=False,
        max_concurrent_batches=2 if async_scheduling else 1,
        max_in_flight_tokens=max_num_batched_tokens,
        num_speculative_tokens=num_speculative_tokens,
        num_lookahead_tokens=num_speculative_tokens if drafter in ("draft_model", "eagle") else 0,
        num_prefill_lookahead_tokens=0,
        num_hash_lookahead_tokens=0,
        use_v2_model_runner=False,
    )
