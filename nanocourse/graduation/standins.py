"""The project's own minimal stand-ins for the vLLM modules that vLLM's v1 core files import but the graduation
run does not compare: logging, envs, config, platform, metrics, KV events, connectors, multimodal, hashing.

STANDINS maps each module's dotted name to the names it provides. Every name must exist in the wheel's real module
under the same name, and a stand-in function's parameters must be among the real one's
(tests/course/test_graduation.py reads the wheel's source to check both). A stand-in either does what the real one
does for the calls the run makes (init_logger, hashing, FinishReason, ConstantList, the KV events) or is an
`Unreached` class: the run never takes the path that uses it, and if it ever did, it fails naming the stand-in.
"""

from __future__ import annotations

import contextlib
import enum
import hashlib
import logging
import pickle
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import xxhash as _xxhash


class StandInReached(RuntimeError):
    """vLLM took a path the graduation's stand-ins do not serve: the run is missing a stand-in, not the part."""


class Unreached:
    """A vLLM class that only paths the graduation run never takes use (connectors, multimodal, metrics
    publishing). Annotations and isinstance checks see a class; building one or reading its attributes raises."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise StandInReached(
            f"{type(self).__qualname__} is a stand-in (nanocourse/graduation/standins.py): the graduation run was "
            "not meant to reach the vLLM path that builds it"
        )

    def __class_getitem__(cls, item: Any) -> type:
        return cls


def unreached(name: str) -> type:
    return type(name, (Unreached,), {"__qualname__": name})


# ---- vllm.logger ----------------------------------------------------------------------------------------------


class _Logger(logging.LoggerAdapter):
    """vLLM's logger's extra methods (the *_once variants log each message once; here every message goes to a
    logger that prints nothing)."""

    def debug_once(self, msg: str, *args: Any, **kwargs: Any) -> None:
        self.debug(msg, *args)

    def info_once(self, msg: str, *args: Any, **kwargs: Any) -> None:
        self.info(msg, *args)

    def warning_once(self, msg: str, *args: Any, **kwargs: Any) -> None:
        self.warning(msg, *args)


_QUIET = logging.getLogger("nanocourse.graduation.vllm")
_QUIET.addHandler(logging.NullHandler())
_QUIET.propagate = False  # vLLM's warnings about the run's own tiny pools would only be noise in the report


def init_logger(name: str) -> _Logger:
    return _Logger(_QUIET.getChild(name), {})


# ---- vllm.envs: the environment variables the loaded files read, at their defaults ------------------------------


class envs:
    VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES = True
    VLLM_COMPUTE_NANS_IN_LOGITS = False


# ---- vllm.utils.hashing: as vLLM's (pickle, then SHA-256 or xxHash3-128); CBOR's variants are not used ----------


def sha256(input: Any) -> bytes:
    return hashlib.sha256(pickle.dumps(input, protocol=pickle.HIGHEST_PROTOCOL)).digest()


def xxhash(input: Any) -> bytes:
    return _xxhash.xxh3_128_digest(pickle.dumps(input, protocol=pickle.HIGHEST_PROTOCOL))


def xxhash_cbor(input: Any) -> bytes:
    raise StandInReached("xxhash_cbor needs cbor2, which the course does not install: use xxhash or sha256")


# ---- vllm.distributed.kv_events: the events as plain dataclasses with the real Structs' fields ------------------

MEDIUM_GPU = "GPU"
MEDIUM_CPU = "CPU"


class KVCacheEvent:
    pass


@dataclass
class BlockStored(KVCacheEvent):
    block_hashes: list
    parent_block_hash: Any
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None
    locality: str | None = None
    ownership: str | None = None
    session_id: str | None = None
    lookahead_token_ids: list | None = None


@dataclass
class BlockRemoved(KVCacheEvent):
    block_hashes: list
    medium: str | None
    group_idx: int | None = None
    locality: str | None = None
    ownership: str | None = None


@dataclass
class AllBlocksCleared(KVCacheEvent):
    pass


class NullEventPublisher:
    """No KV events configured: nothing is published (vLLM's NullEventPublisher)."""

    def publish(self, events: Any) -> None:
        pass

    def shutdown(self) -> None:
        pass


class EventPublisherFactory:
    @classmethod
    def create(cls, config: Any, data_parallel_rank: int = 0) -> NullEventPublisher:
        if config is not None and config.enable_kv_cache_events:
            raise StandInReached("the graduation run publishes no KV events")
        return NullEventPublisher()


# ---- vllm.v1.engine ---------------------------------------------------------------------------------------------


class FinishReason(enum.IntEnum):
    STOP = 0
    LENGTH = 1
    ABORT = 2
    ERROR = 3
    REPETITION = 4


class EngineCoreEventType(enum.IntEnum):
    QUEUED = 1
    SCHEDULED = 2
    PREEMPTED = 3


@dataclass
class EngineCoreEvent:
    type: EngineCoreEventType
    timestamp: float

    @classmethod
    def new_event(cls, event_type: EngineCoreEventType, timestamp: float | None = None) -> EngineCoreEvent:
        return cls(event_type, time.monotonic() if timestamp is None else timestamp)


@dataclass
class EngineCoreOutput:
    """What update_from_output reports per request: its new tokens and, once finished, why."""

    request_id: str
    new_token_ids: list[int]
    new_logprobs: Any = None
    new_prompt_logprobs_tensors: Any = None
    pooling_output: Any = None
    finish_reason: FinishReason | None = None
    stop_reason: int | str | None = None
    events: list[EngineCoreEvent] | None = None
    kv_transfer_params: dict[str, Any] | None = None
    ec_transfer_params: dict[str, Any] | None = None
    trace_headers: Any = None
    prefill_stats: Any = None
    routed_experts: Any = None
    num_nans_in_logits: int = 0
    mm_cache_miss_hashes: list[str] | None = None
    new_sampling_mask: Any = None
    spec_decode_metrics: Any = None
    prompt_token_id_logprobs: Any = None
    error: Any = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class EngineCoreOutputs:
    engine_index: int = 0
    outputs: list[EngineCoreOutput] = field(default_factory=list)
    scheduler_stats: Any = None
    timestamp: float = 0.0
    utility_output: Any = None
    finished_requests: set[str] | None = None
    wave_complete: int | None = None
    start_wave: int | None = None
    weight_version: str | None = None


# ---- vllm.v1.utils ----------------------------------------------------------------------------------------------


class ConstantList(Sequence):
    """A read-only view of a list (Request.all_token_ids): reads go to the list, writes raise TypeError."""

    def __init__(self, x: list) -> None:
        self._x = x

    def __getitem__(self, item):
        return self._x[item]

    def __len__(self) -> int:
        return len(self._x)

    def __iter__(self):
        return iter(self._x)

    def __repr__(self) -> str:
        return f"ConstantList({self._x})"

    def copy(self) -> list:
        return self._x.copy()


def record_function_or_nullcontext(name: str) -> contextlib.AbstractContextManager:
    """No profiler: a context that does nothing (vLLM's default without its profiling env variables)."""
    return contextlib.nullcontext()


def get_dtype_size(dtype: Any) -> int:
    """Bytes per element of a torch dtype (KV cache specs size their pages with it)."""
    return dtype.itemsize


# ---- vllm.utils -------------------------------------------------------------------------------------------------


def length_from_prompt_token_ids_or_embeds(prompt_token_ids: list[int] | None, prompt_embeds: Any = None) -> int:
    if prompt_token_ids is None:
        raise ValueError("the graduation run gives every request prompt_token_ids")
    return len(prompt_token_ids)


# ---- vllm.v1.structured_output.request ---------------------------------------------------------------------------


class StructuredOutputRequest(Unreached):
    @staticmethod
    def from_sampling_params(sampling_params: Any) -> None:
        """No request of the run asks for structured output."""
        return


class StructuredOutputManager:
    """No request of the run has a grammar, so (as vLLM's manager does for such requests) every token is accepted,
    drafts pass unchanged and there is no bitmask."""

    def accept_tokens(self, request: Any, new_token_ids: list[int]) -> bool:
        assert not request.use_structured_output
        return True

    def validate_tokens(self, request: Any, spec_tokens: list[int]) -> list[int]:
        assert not request.use_structured_output
        return spec_tokens

    def grammar_bitmask(
        self, requests: dict, structured_output_request_ids: list[str], scheduled_spec_decode_tokens: dict
    ) -> None:
        assert not structured_output_request_ids


# ---- vllm.multimodal.utils: the run's requests carry no multimodal features ---------------------------------------


def get_mm_features_in_window(mm_features: Any, start: int, end: int) -> Any:
    raise StandInReached("the graduation run's requests carry no multimodal features")


# ---- vllm.v1.spec_decode.metrics ---------------------------------------------------------------------------------


@dataclass
class SpecDecodingStats:
    """One step's drafting counts, as vLLM's scheduler gathers them."""

    num_spec_tokens: int
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_accepted_tokens_per_pos: list[int] = field(default_factory=list)
    num_draft_tokens_per_pos: list[int] = field(default_factory=list)

    @classmethod
    def new(cls, num_spec_tokens: int) -> SpecDecodingStats:
        return cls(
            num_spec_tokens,
            num_accepted_tokens_per_pos=[0] * num_spec_tokens,
            num_draft_tokens_per_pos=[0] * num_spec_tokens,
        )

    def observe_draft(self, num_draft_tokens: int, num_accepted_tokens: int) -> None:
        self.num_drafts += 1
        self.num_draft_tokens += num_draft_tokens
        self.num_accepted_tokens += num_accepted_tokens
        for i in range(num_accepted_tokens):
            self.num_accepted_tokens_per_pos[i] += 1
        for i in range(num_draft_tokens):
            self.num_draft_tokens_per_pos[i] += 1


# ---- vllm.lora.request: the adapter a request names (its name and path go into every block's hash) -------------


@dataclass
class LoRARequest:
    lora_name: str
    lora_int_id: int
    lora_path: str = ""


# ---- vllm.sampling_params: the fields the scheduler and Request read, with SamplingParams's defaults -------------


@dataclass
class RepetitionDetectionParams:
    max_pattern_size: int = 0
    min_pattern_size: int = 0
    min_count: int = 0


@dataclass
class SamplingParams:
    """What vLLM's scheduler reads of a request's sampling: no stop tokens unless given, ignore_eos, and prompt
    logprobs, which make a request skip reading the prefix cache (as SamplingParams.__post_init__ decides)."""

    max_tokens: int | None = 16
    ignore_eos: bool = False
    min_tokens: int = 0
    stop_token_ids: list[int] | None = None
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    extra_args: dict[str, Any] | None = None
    repetition_detection: RepetitionDetectionParams | None = None
    skip_reading_prefix_cache: bool | None = None
    _eos_token_id: int | None = None

    def __post_init__(self) -> None:
        self.stop_token_ids = list(self.stop_token_ids or [])
        if self.skip_reading_prefix_cache is None:
            self.skip_reading_prefix_cache = self.prompt_logprobs is not None

    @property
    def eos_token_id(self) -> int | None:
        return self._eos_token_id

    @property
    def all_stop_token_ids(self) -> set[int]:
        return set(self.stop_token_ids or [])

    @property
    def num_logprobs(self) -> int | None:
        return self.logprobs


# ---- vllm.platforms and vllm.config: no platform-specific KV cache specs, no current config -------------------


class Platform:
    """vLLM's Platform base class: a CPU registers no custom KV cache specs."""

    @classmethod
    def register_custom_kv_cache_specs(cls, vllm_config: Any) -> None:
        pass

    def is_xpu(self) -> bool:
        """The AsyncScheduler asks (an XPU may turn off its pipeline-parallel microbatching): not an XPU."""
        return False


current_platform = Platform()


def get_current_vllm_config_or_none() -> None:
    return None


MultiModalRegistry = unreached("MultiModalRegistry")
# The scheduler's default argument: a registry it only consults for multimodal models.
MULTIMODAL_REGISTRY = object.__new__(MultiModalRegistry)


def _unreached(*names: str) -> dict[str, type]:
    return {name: unreached(name) for name in names}


def strip_covered_mm_data(mm_features: list, num_computed_tokens: int, uses_mrope: bool = False) -> list:
    """Without multimodal features there is nothing to strip (vLLM returns an empty list as it is)."""
    if mm_features:
        raise StandInReached("the graduation run's requests carry no multimodal features")
    return mm_features


STANDINS: dict[str, dict[str, Any]] = {
    "vllm.sampling_params": {"SamplingParams": SamplingParams, "RepetitionDetectionParams": RepetitionDetectionParams},
    "vllm.logger": {"init_logger": init_logger},
    "vllm.envs": {k: v for k, v in vars(envs).items() if k.startswith("VLLM_")},
    "vllm.utils.hashing": {"sha256": sha256, "xxhash": xxhash, "xxhash_cbor": xxhash_cbor},
    "vllm.distributed.kv_events": {
        "MEDIUM_GPU": MEDIUM_GPU,
        "MEDIUM_CPU": MEDIUM_CPU,
        "KVCacheEvent": KVCacheEvent,
        "BlockStored": BlockStored,
        "BlockRemoved": BlockRemoved,
        "AllBlocksCleared": AllBlocksCleared,
        "KVEventBatch": unreached("KVEventBatch"),
        "EventPublisherFactory": EventPublisherFactory,
        "NullEventPublisher": NullEventPublisher,
    },
    "vllm.v1.engine": {
        "FinishReason": FinishReason,
        "EngineCoreEventType": EngineCoreEventType,
        "EngineCoreEvent": EngineCoreEvent,
        "EngineCoreRequest": unreached("EngineCoreRequest"),
        "EngineCoreOutput": EngineCoreOutput,
        "EngineCoreOutputs": EngineCoreOutputs,
    },
    "vllm.v1.utils": {
        "ConstantList": ConstantList,
        "tensor_data": unreached("tensor_data"),
        "record_function_or_nullcontext": record_function_or_nullcontext,
    },
    "vllm.utils": {"length_from_prompt_token_ids_or_embeds": length_from_prompt_token_ids_or_embeds},
    "vllm.v1.structured_output.request": {"StructuredOutputRequest": StructuredOutputRequest},
    "vllm.multimodal.utils": {
        "get_mm_features_in_window": get_mm_features_in_window,
        "strip_covered_mm_data": strip_covered_mm_data,
    },
    "vllm.v1.kv_hints": {"KvHintsEnvelope": unreached("KvHintsEnvelope")},
    "vllm.lora.request": {"LoRARequest": LoRARequest},
    "vllm.pooling_params": {"PoolingParams": unreached("PoolingParams")},
    "vllm.config": {
        **_unreached("VllmConfig", "KVEventsConfig"),
        "get_current_vllm_config_or_none": get_current_vllm_config_or_none,
    },
    "vllm.platforms": {"current_platform": current_platform},
    "vllm.platforms.interface": {"Platform": Platform},
    "vllm.utils.import_utils": {"resolve_obj_by_qualname": unreached("resolve_obj_by_qualname")},
    "vllm.compilation.cuda_graph": {"CUDAGraphStat": unreached("CUDAGraphStat")},
    "vllm.v1.metrics.perf": {"PerfStats": unreached("PerfStats"), "ModelMetrics": unreached("ModelMetrics")},
    "vllm.v1.spec_decode.metrics": {"SpecDecodingStats": SpecDecodingStats},
    "vllm.multimodal": {"MULTIMODAL_REGISTRY": MULTIMODAL_REGISTRY, "MultiModalRegistry": MultiModalRegistry},
    "vllm.multimodal.encoder_budget": _unreached("MultiModalBudget"),
    "vllm.config.ec_manager_config": _unreached("EncoderCacheManagerMetadata"),
    "vllm.distributed.aux_output_connector.connector": _unreached("AuxOutputSchedulerConnector"),
    "vllm.distributed.ec_transfer.ec_connector.base": _unreached(
        "ECConnectorBase", "ECConnectorMetadata", "ECConnectorRole"
    ),
    "vllm.distributed.ec_transfer.ec_connector.factory": _unreached("ECConnectorFactory"),
    "vllm.distributed.ec_transfer.ec_connector.metrics": _unreached("ECConnectorStats"),
    "vllm.distributed.kv_transfer.kv_connector.factory": _unreached("KVConnectorFactory"),
    "vllm.distributed.kv_transfer.kv_connector.v1": _unreached("KVConnectorBase_V1", "KVConnectorRole", "SupportsHMA"),
    "vllm.distributed.kv_transfer.kv_connector.v1.base": _unreached("KVConnectorMetadata"),
    "vllm.distributed.kv_transfer.kv_connector.v1.metrics": _unreached("KVConnectorStats"),
    "vllm.outputs": _unreached("RequestError"),
    "vllm.utils.torch_utils": {"get_dtype_size": get_dtype_size, "PIN_MEMORY": False},
    "vllm.v1.spec_decode.dynamic.utils": _unreached("build_dynamic_sd_schedule_lookup"),
    "vllm.v1.structured_output": {"StructuredOutputManager": StructuredOutputManager},
    "vllm.v1.structured_output.utils": _unreached("strip_speculative_padding"),
    "vllm.multimodal.inputs": _unreached("MultiModalFeatureSpec", "MultiModalKwargsItem"),
}
