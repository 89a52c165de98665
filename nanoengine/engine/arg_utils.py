"""LLM(...)'s keyword arguments, checked and resolved into one EngineConfig (vllm/engine/arg_utils.py)."""

from __future__ import annotations

import dataclasses
import os
import reprlib
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

import torch

from nanoengine.attention import BACKENDS, AttentionBackend, get_backend, triton_available
from nanoengine.config import CacheConfig, ModelConfig, SchedulerConfig, SpeculativeConfig
from nanoengine.config.engine import EngineConfig
from nanoengine.config.scheduler import SCHEDULING_POLICIES
from nanoengine.core import (
    HASH_ALGOS,
    FreeBlockQueue,
    FullAttentionManager,
    KVCacheBlock,
    KVCacheManager,
    SlidingWindowManager,
)
from nanoengine.core.sched.async_scheduler import AsyncScheduler
from nanoengine.core.sched.scheduler import Scheduler
from nanoengine.errors import InvalidEngineArgumentError
from nanoengine.model.llama import QUANTIZATION_METHODS, LlamaForCausalLM
from nanoengine.model.loader import read_config, unpacked_folder
from nanoengine.parts import EngineParts, build_part, missing_members
from nanoengine.sample.rejection_sampler import rejection_sample
from nanoengine.spec_decode.ngram_proposer import NgramProposer
from nanoengine.validation import check_bool, check_choice, check_int, check_names, check_real
from nanoengine.worker.block_table import BlockTable

_FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
# dtype's names, as vLLM's ModelConfig takes them (_STR_DTYPE_TO_TORCH_DTYPE); "auto" is the device's default.
STR_DTYPES = {
    "half": torch.float16,
    "float16": torch.float16,
    "float": torch.float32,
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
}
# The engine's own part for each part argument; None (like leaving the argument out) takes it.
_DEFAULT_PARTS: dict[str, Any] = {
    "attention_backend": None,
    "hash_block_tokens": None,
    "block_pool": None,
    "free_queue_cls": None,
    "full_attention_manager_cls": FullAttentionManager,
    "sliding_window_manager_cls": SlidingWindowManager,
    "kv_cache_manager_cls": KVCacheManager,
    "scheduler_cls": Scheduler,
    "block_table_cls": BlockTable,
    "proposer_cls": NgramProposer,
    "rejection_sampler": rejection_sample,
}
_FUNCTION_PARTS = {
    "hash_block_tokens": "a function (parent_hash, token_ids, extra_keys)",
    "rejection_sampler": "a function (logits, draft_token_ids, params, generators)",
}
# async_scheduling=None's choice where it is supported. vLLM's is True: on a GPU the forward pass is launched and
# runs on the device while the CPU schedules the next step, so the scheduler's time hides under the GPU's. On the
# CPU there is no such device: torch's kernels take every core for the forward pass, so the scheduler's thread only
# competes with them, and bench/results/async_scheduling_cpu.json measured async at 0.71 to 0.91 of sync's tokens/s
# (2 cores under a load average of 14.7 from other work; the host's share of a step is under 0.5%). The engine is not yet measured on a GPU with it, so it stays off there
# too until it is: pass async_scheduling=True for vLLM's default.
ASYNC_DEFAULT = False
# The single-type manager parts: subclasses of the engine's class, since the coordinator builds them itself.
_MANAGER_PARTS = ("full_attention_manager_cls", "sliding_window_manager_cls")


def resolve_device(device: str | torch.device) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def bf16_supported(device: torch.device) -> bool:
    """Whether `device` runs bf16 natively: the CPU, and CUDA from compute capability 8.0 (Ampere) on.
    (torch.cuda.is_bf16_supported() also says yes on a T4, through emulation.)"""
    return device.type != "cuda" or torch.cuda.get_device_capability(device) >= (8, 0)


def default_dtype(device: torch.device) -> torch.dtype:
    """The engine's dtype when none is given: fp32 on the CPU; on CUDA bf16 from compute capability 8.0
    (Ampere) on, fp16 below it (Turing's T4, Volta), which has no bf16. vLLM 0.33 falls back the same
    way: CudaPlatform.supported_dtypes (vllm/platforms/cuda.py) drops bf16 below capability 8.0, and
    _resolve_auto_dtype (vllm/config/model.py) then takes fp16 for a bf16 checkpoint.
    The CPU stays fp32 even where bf16 is faster (AMX, AVX512-BF16: ask for dtype="bfloat16"): stored greedy
    outputs and the HF reference test are fp32, and a default that followed the CPU would change them on a machine
    without those instructions."""
    if device.type != "cuda":
        return torch.float32
    return torch.bfloat16 if bf16_supported(device) else torch.float16


def available_devices() -> list[str]:
    """The devices this machine can run the engine on, as LLM(device=...) takes them."""
    devices = ["auto", "cpu"]
    if torch.cuda.is_available():
        devices += ["cuda"] + [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    if torch.backends.mps.is_available():
        devices.append("mps")
    return devices


def check_device(device: str | torch.device) -> torch.device:
    """The device LLM(device=...) names, refused unless this machine has it ("auto": CUDA if present)."""
    if isinstance(device, str) and device == "auto":
        return resolve_device(device)
    err = InvalidEngineArgumentError
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError):
        raise err(
            f"device must be 'auto', 'cpu' or 'cuda' (or a torch.device), got {reprlib.repr(device)}.",
            parameter="device",
            value=device,
        ) from None
    usable = (
        resolved.type == "cpu"
        or (resolved.type == "cuda" and torch.cuda.is_available() and (resolved.index or 0) < torch.cuda.device_count())
        or (resolved.type == "mps" and torch.backends.mps.is_available())
    )
    if not usable:
        why = "holds no data to compute with" if resolved.type == "meta" else "is not on this machine"
        raise err(
            f"device={reprlib.repr(device)} {why}. This machine runs the engine on: {', '.join(available_devices())}.",
            parameter="device",
            value=device,
        )
    return resolved


@dataclass(kw_only=True)
class EngineArgs:
    """Every keyword argument of LLM(...), with its default (vLLM's EngineArgs, the subset nanoengine has).

    create_engine_config() checks each one (a wrong type or a value out of range raises
    InvalidEngineArgumentError naming it), reads the model's shape, resolves the device, dtype, max_model_len
    and parts, and returns the EngineConfig the engine is built from. The part arguments (`parts.py`) take None
    as the engine's own part.

    async_scheduling (vLLM's argument): True schedules step N + 1 while step N runs, with the AsyncScheduler
    and the engine's batch queue of two; False runs each step whole; None, the default, picks ASYNC_DEFAULT
    where async scheduling is supported, as vLLM's VllmConfig does (not with speculative_config, and not with
    a scheduler_cls that is no AsyncScheduler; True with either is refused, naming async_scheduling).
    """

    model: str | os.PathLike | LlamaForCausalLM | None = None
    device: str | torch.device = "auto"
    dtype: torch.dtype | str | None = None
    quantization: str | None = None
    enable_prefix_caching: bool = True
    block_size: int = 16
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    long_prefill_token_threshold: int = 0
    long_prefill_token_threshold_adaptive: bool = False
    kv_cache_memory_bytes: int | None = None
    num_gpu_blocks_override: int | None = None
    gpu_memory_utilization: float = 0.9
    max_model_len: int | None = None
    scheduling_policy: str = "fcfs"
    hash_algo: str = "xxhash"
    enforce_eager: bool = False
    max_logprobs: int = 20
    speculative_config: dict | None = None
    async_scheduling: bool | None = None
    progress: bool = True
    # The parts (parts.py): None, the default, takes the engine's own (_DEFAULT_PARTS).
    attention_backend: Any = None
    hash_block_tokens: Callable | None = None
    block_pool: Callable | None = None
    free_queue_cls: type[FreeBlockQueue] | None = None
    full_attention_manager_cls: type[FullAttentionManager] | None = None
    kv_cache_manager_cls: type | None = None
    scheduler_cls: type | None = None
    block_table_cls: type | None = None
    sliding_window_manager_cls: type[SlidingWindowManager] | None = None
    proposer_cls: type | None = None
    rejection_sampler: Callable | None = None

    @classmethod
    def from_kwargs(cls, model: str | os.PathLike | LlamaForCausalLM | None, kwargs: dict) -> EngineArgs:
        """LLM(model, **kwargs)'s arguments; an unknown keyword is refused by name, with the closest known one and
        all of them listed."""
        check_names(InvalidEngineArgumentError, "LLM", kwargs, {f.name for f in dataclasses.fields(cls)})
        return cls(model=model, **kwargs)

    def create_engine_config(self) -> EngineConfig:
        self._check()
        speculative = SpeculativeConfig.from_dict(self.speculative_config)
        model_config = self._model_config()
        async_scheduling = self._async_scheduling(speculative)
        parts = self._parts(model_config.device, async_scheduling)
        cache_config = CacheConfig(
            block_size=self.block_size,
            enable_prefix_caching=self.enable_prefix_caching,
            hash_algo=self.hash_algo,
            kv_cache_memory_bytes=self.kv_cache_memory_bytes,
            gpu_memory_utilization=self.gpu_memory_utilization,
            num_gpu_blocks_override=self.num_gpu_blocks_override,
        )
        scheduler_config = SchedulerConfig(
            max_num_batched_tokens=self.max_num_batched_tokens,
            max_num_seqs=self.max_num_seqs,
            long_prefill_token_threshold=self.long_prefill_token_threshold,
            policy=self.scheduling_policy,
            max_model_len=model_config.max_model_len,
            long_prefill_token_threshold_adaptive=self.long_prefill_token_threshold_adaptive,
            num_lookahead_tokens=speculative.num_lookahead_tokens if speculative else 0,
            num_spec_tokens=speculative.num_speculative_tokens if speculative else 0,
            max_num_new_slots_for_drafting=speculative.max_num_new_slots_for_drafting if speculative else 0,
            async_scheduling=async_scheduling,
        )
        return EngineConfig(
            model_config=model_config,
            cache_config=cache_config,
            scheduler_config=scheduler_config,
            parts=parts,
            speculative_config=speculative,
        )

    def _model_config(self) -> ModelConfig:
        if isinstance(self.model, LlamaForCausalLM):
            if self.quantization is not None:
                raise InvalidEngineArgumentError(
                    "quantization applies to a model the engine loads itself; a ready LlamaForCausalLM runs as "
                    "it is. Quantize it first (model.llama.QUANTIZATION_METHODS) and pass quantization=None.",
                    parameter="quantization",
                    value=self.quantization,
                )
            # A ready model (random weights in a test or a lab) runs where its weights are.
            weight = next(self.model.parameters())
            path, folder, hf_config, device, dtype = None, None, self.model.config, weight.device, weight.dtype
        else:
            path, folder = unpacked_folder(self.model, self.progress)
            hf_config, device = read_config(folder), resolve_device(self.device)  # checked by _check
            named = STR_DTYPES.get(self.dtype) if isinstance(self.dtype, str) else self.dtype
            dtype = named or default_dtype(device)  # None and "auto" take the device's default
            if self.quantization is not None and device.type != "cpu":
                raise InvalidEngineArgumentError(
                    f"quantization={self.quantization!r} runs on the CPU only (torch's CPU kernels); "
                    f"this engine runs on {device}. Leave quantization=None there.",
                    parameter="quantization",
                    value=self.quantization,
                )
            if self.quantization == "q4_1" and dtype is not torch.bfloat16:
                # Its 4-bit kernel is exact in fp32 too, but slower there than the dense fp32 GEMM.
                raise InvalidEngineArgumentError(
                    f"quantization='q4_1' computes with bf16 activations, where torch's 4-bit kernel is fast; this "
                    f"engine's dtype is {dtype}. Pass dtype='bfloat16' with it.",
                    parameter="quantization",
                    value=self.quantization,
                )
            if dtype is torch.bfloat16 and not bf16_supported(device):
                # vLLM's CudaPlatform.check_if_supports_dtype refuses it the same way.
                major, minor = torch.cuda.get_device_capability(device)
                raise InvalidEngineArgumentError(
                    f"dtype=torch.bfloat16 needs compute capability 8.0 (Ampere) or newer; this GPU has "
                    f"{major}.{minor}. Use dtype=torch.float16, or None for the device's default.",
                    parameter="dtype",
                    value=self.dtype,
                )
        limit = hf_config.max_position_embeddings
        if self.max_model_len is not None and self.max_model_len > limit:
            raise InvalidEngineArgumentError(
                f"max_model_len={self.max_model_len} exceeds the model's {limit} positions "
                f"(max_position_embeddings); give at most {limit}, or None for the model's own.",
                parameter="max_model_len",
                value=self.max_model_len,
            )
        return ModelConfig(
            model=self.model,
            model_path=path,
            folder=folder,
            hf_config=hf_config,
            device=device,
            dtype=dtype,
            max_model_len=self.max_model_len or limit,
            max_logprobs=self.max_logprobs,
            enforce_eager=self.enforce_eager,
            progress=self.progress,
            quantization=self.quantization,
        )

    def _async_scheduling(self, speculative: SpeculativeConfig | None) -> bool:
        """async_scheduling resolved (vLLM's VllmConfig.__post_init__ does it there): None takes ASYNC_DEFAULT
        unless something here cannot run it; True with such a thing is refused."""
        scheduler_cls = self.scheduler_cls
        if speculative is not None:
            unsupported = "speculative_config (the runner does not fill in draft placeholders on the device)"
        elif scheduler_cls is not None and not (
            isinstance(scheduler_cls, type) and issubclass(scheduler_cls, AsyncScheduler)
        ):
            unsupported = "a scheduler_cls that is no core.sched.async_scheduler.AsyncScheduler"
        else:
            return ASYNC_DEFAULT if self.async_scheduling is None else self.async_scheduling
        if self.async_scheduling:
            raise InvalidEngineArgumentError(
                f"async_scheduling=True cannot run with {unsupported}. Pass async_scheduling=False, or None to "
                "let the engine choose.",
                parameter="async_scheduling",
                value=self.async_scheduling,
            )
        return False

    def _parts(self, device: torch.device, async_scheduling: bool) -> EngineParts:
        values = {name: getattr(self, name) for name in _DEFAULT_PARTS}
        given = frozenset(n for n, v in values.items() if v is not None and v is not _DEFAULT_PARTS[n])
        resolved = {n: _DEFAULT_PARTS[n] if v is None else v for n, v in values.items()}
        if async_scheduling and self.scheduler_cls is None:
            resolved["scheduler_cls"] = AsyncScheduler  # vLLM's SchedulerConfig.get_scheduler_cls
        backend = self.attention_backend or ("triton" if device.type == "cuda" and triton_available() else "torch")
        resolved["attention_backend"] = get_backend(backend) if isinstance(backend, str) else backend
        if self.hash_block_tokens is not None:  # one block named first: a key the prefix cache can use
            name = build_part(
                "hash_block_tokens",
                self.hash_block_tokens,
                None,
                "(None, token_ids, None)",
                None,
                tuple(range(self.block_size)),
                None,
            )
            if name is None or not isinstance(name, Hashable):
                raise InvalidEngineArgumentError(
                    f"hash_block_tokens returned {reprlib.repr(name)} for a block; it must return the block's "
                    "name, a hashable value such as bytes.",
                    parameter="hash_block_tokens",
                    value=self.hash_block_tokens,
                )
        if self.free_queue_cls is not None:  # a queue of two blocks first, so that a broken queue is named as such
            build_part(
                "free_queue_cls", self.free_queue_cls, FreeBlockQueue, "(blocks)", [KVCacheBlock(0), KVCacheBlock(1)]
            )
        if isinstance(self.attention_backend, str):  # a name picks one of the engine's own backends
            given -= {"attention_backend"}
        return EngineParts(**resolved, given=given)

    def _check(self) -> None:
        """Every argument's type and range, before anything is read or built."""
        err = InvalidEngineArgumentError
        model = self.model
        if model is not None and not isinstance(model, (str, os.PathLike, LlamaForCausalLM)):
            raise err(
                f"model must be a GGUF path, a LlamaForCausalLM or None (the embedded SmolLM2), got a "
                f"{type(model).__name__}.",
                parameter="model",
                value=model,
            )
        check_device(self.device)  # a ready model runs where its weights are, but a bad device is still a mistake
        if isinstance(self.dtype, str):
            check_choice(err, "dtype", self.dtype, ("auto", *STR_DTYPES))
        elif self.dtype is not None and not any(self.dtype is d for d in _FLOAT_DTYPES):
            raise err(
                f"dtype must be None or 'auto' (the device's default), one of {_FLOAT_DTYPES}, or a name of "
                f"one ({', '.join(STR_DTYPES)}), got {self.dtype!r}.",
                parameter="dtype",
                value=self.dtype,
            )
        if self.quantization is not None:
            check_choice(err, "quantization", self.quantization, tuple(QUANTIZATION_METHODS))
        for name in ("enable_prefix_caching", "enforce_eager", "progress", "long_prefill_token_threshold_adaptive"):
            check_bool(err, name, getattr(self, name))
        if self.async_scheduling is not None and not isinstance(self.async_scheduling, bool):
            raise err(
                f"async_scheduling must be True, False or None (the engine chooses), got {self.async_scheduling!r}.",
                parameter="async_scheduling",
                value=self.async_scheduling,
            )
        check_int(err, "block_size", self.block_size, low=1, hint="16 is vLLM's default.")
        check_int(err, "max_num_seqs", self.max_num_seqs, low=1)
        check_int(err, "max_num_batched_tokens", self.max_num_batched_tokens, low=1)
        check_int(err, "long_prefill_token_threshold", self.long_prefill_token_threshold, low=0, hint="0 sets no cap.")
        check_int(err, "kv_cache_memory_bytes", self.kv_cache_memory_bytes, low=1, none_ok=True)
        check_int(err, "num_gpu_blocks_override", self.num_gpu_blocks_override, none_ok=True)
        check_real(err, "gpu_memory_utilization", self.gpu_memory_utilization, low=0.0, high=1.0, low_open=True)
        # A prompt of one token and one new token: the least a request can be.
        check_int(err, "max_model_len", self.max_model_len, low=2, none_ok=True, hint="None takes the model's own.")
        check_int(err, "max_logprobs", self.max_logprobs, low=-1, hint="-1 allows the whole vocabulary.")
        check_choice(err, "scheduling_policy", self.scheduling_policy, SCHEDULING_POLICIES)
        check_choice(err, "hash_algo", self.hash_algo, HASH_ALGOS)
        backend = self.attention_backend
        if backend is not None and not isinstance(backend, str):
            if missing := missing_members(backend, AttentionBackend):
                raise err(
                    "attention_backend must be 'torch', 'triton' or an AttentionBackend; the "
                    f"{type(backend).__name__} given lacks {', '.join(missing)}. Subclass "
                    "attention.backend.KernelBackend, or give the missing members.",
                    parameter="attention_backend",
                    value=backend,
                )
        elif backend is not None:
            check_choice(err, "attention_backend", backend, BACKENDS)
        for name in _DEFAULT_PARTS:
            part = getattr(self, name)
            if name != "attention_backend" and part is not None and not callable(part):
                what = _FUNCTION_PARTS.get(
                    name, "a class (or a factory) to build the part from; pass the class itself, not an instance"
                )
                raise err(f"{name} must be {what}, got a {type(part).__name__}.", parameter=name, value=part)
        for name in _MANAGER_PARTS:
            cls, base = getattr(self, name), _DEFAULT_PARTS[name]
            if cls is not None and not (isinstance(cls, type) and issubclass(cls, base)):
                raise err(f"{name} must be a subclass of core.{base.__name__}, got {cls!r}.", parameter=name, value=cls)
