"""The engine's settings, as vLLM's vllm/config/ holds them: one dataclass per part, in one EngineConfig."""

from nanoengine.config.cache import CacheConfig
from nanoengine.config.model import LAYER_TYPES, LlamaConfig, ModelConfig
from nanoengine.config.scheduler import SCHEDULING_POLICIES, SchedulerConfig
from nanoengine.config.speculative import SPECULATIVE_METHODS, SpeculativeConfig

__all__ = [
    "LAYER_TYPES",
    "SCHEDULING_POLICIES",
    "SPECULATIVE_METHODS",
    "CacheConfig",
    "LlamaConfig",
    "ModelConfig",
    "SchedulerConfig",
    "SpeculativeConfig",
]
