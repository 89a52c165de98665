"""The user-facing engine: LLM(...).generate(prompts, SamplingParams(...)) (vllm/entrypoints/llm.py)."""

from __future__ import annotations

import dataclasses
import inspect
import logging
import numbers
import os
import reprlib
import traceback
import weakref
from collections.abc import Callable, Hashable, Iterator, Sequence

import torch

from nanoengine.attention import BACKENDS, AttentionBackend, get_backend, triton_available
from nanoengine.attention.backend import is_pow2
from nanoengine.attention.paged import PagedKVCache, kv_cache_groups
from nanoengine.config import SpeculativeConfig
from nanoengine.core import (
    HASH_ALGOS,
    BlockPool,
    BlockPoolInterface,
    BlockTokensHasher,
    FreeBlockQueue,
    FullAttentionManager,
    KVCacheBlock,
    KVCacheManager,
    KVCacheManagerInterface,
    SlidingWindowManager,
)
from nanoengine.core.sched.interface import SchedulerInterface
from nanoengine.core.sched.scheduler import Scheduler, SchedulerConfig
from nanoengine.engine.llm_engine import EngineStats, LLMEngine
from nanoengine.errors import (
    InvalidEngineArgumentError,
    InvalidRequestError,
    KVCacheTooSmallError,
    ModelNotFoundError,
    RequestAbortedError,
    UnsupportedModelError,
)
from nanoengine.model import LlamaForCausalLM
from nanoengine.model.llama_eagle import EagleLlamaForCausalLM
from nanoengine.model.loader import read_config, read_weights, unpacked_folder
from nanoengine.model.tokenizer import Tokenizer
from nanoengine.outputs import RequestMetrics, RequestOutput
from nanoengine.sample.rejection_sampler import rejection_sample
from nanoengine.sampling_params import SamplingParams
from nanoengine.spec_decode.draft_model import DraftModelProposer
from nanoengine.spec_decode.eagle import EagleProposer
from nanoengine.spec_decode.ngram_proposer import NgramProposer
from nanoengine.validation import check_bool, check_choice, check_int, check_optional_str, check_real
from nanoengine.worker.block_table import BlockTable, BlockTableInterface
from nanoengine.worker.cuda_graphs import DecodeGraphs
from nanoengine.worker.model_runner import ModelRunner

logger = logging.getLogger("nanoengine")

DEFAULT_CPU_KV_BYTES = 512 * 2**20
_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep

# Inference never writes the weights, so engines built from one checkpoint on one device and dtype
# share a single model: a notebook that compares several engines pays for the weights once. The
# entry goes when the last engine using it does.
_MODELS: weakref.WeakValueDictionary[tuple, LlamaForCausalLM] = weakref.WeakValueDictionary()


def _shared_model(folder, config, device: torch.device, dtype: torch.dtype) -> LlamaForCausalLM:
    model = _MODELS.get((folder, device, dtype))
    if model is None:
        model = LlamaForCausalLM.from_state_dict(config, read_weights(folder), device, dtype)
        _MODELS[folder, device, dtype] = model
    return model


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
    _resolve_auto_dtype (vllm/config/model.py) then takes fp16 for a bf16 checkpoint."""
    if device.type != "cuda":
        return torch.float32
    return torch.bfloat16 if bf16_supported(device) else torch.float16


def merge_samples(samples: list[RequestOutput]) -> RequestOutput:
    """One RequestOutput for the n samples of a prompt: completion i is sample i, and the times
    span all of them (first arrival, first token, last finish)."""
    if len(samples) == 1:
        return samples[0]
    first = samples[0]
    times = [s.metrics for s in samples]
    return dataclasses.replace(
        first,
        outputs=[dataclasses.replace(s.outputs[0], index=i) for i, s in enumerate(samples)],
        metrics=RequestMetrics(
            min(t.arrival_time for t in times),
            min(t.first_token_time for t in times),
            max(t.finish_time for t in times),
        ),
    )


def _device_memory(device: torch.device) -> int:
    """All the memory of the device (a GPU's total, the machine's physical memory on a CPU)."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[1]
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):  # Windows has no sysconf
        return 2**62


_SEAMS = (
    "hash_block_tokens",
    "block_pool",
    "free_queue_cls",
    "full_attention_manager_cls",
    "kv_cache_manager_cls",
    "scheduler_cls",
    "block_table_cls",
    "sliding_window_manager_cls",
    "proposer_cls",
    "rejection_sampler",
)
# The seams with a default part, which None (like leaving the argument out) also takes.
_SEAM_DEFAULTS = {
    "kv_cache_manager_cls": KVCacheManager,
    "scheduler_cls": Scheduler,
    "block_table_cls": BlockTable,
    "full_attention_manager_cls": FullAttentionManager,
    "sliding_window_manager_cls": SlidingWindowManager,
    "proposer_cls": NgramProposer,
    "rejection_sampler": rejection_sample,
}
# The single-type manager seams: subclasses of the engine's class, since the coordinator builds them itself.
_MANAGER_SEAMS = ("full_attention_manager_cls", "sliding_window_manager_cls")
_FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)


def _given(name: str, part) -> str | None:
    """The seam's name when `part` is not the engine's own, else None."""
    return None if part is _SEAM_DEFAULTS[name] else name


def _build(name: str | None, factory, protocol, call: str, *args, **kwargs):
    """The part `factory(*args)` builds. When it comes from the seam argument `name` (None: the engine's own),
    failing to build or missing a member of its Protocol (when one is given) raises InvalidEngineArgumentError
    naming it."""
    if name is None:
        return factory(*args, **kwargs)
    try:
        part = factory(*args, **kwargs)
    except Exception as exc:
        raise InvalidEngineArgumentError(
            f"{name}={reprlib.repr(factory)} failed when called as {name}{call}: {type(exc).__name__}: {exc}",
            parameter=name,
            value=factory,
        ) from exc
    members = {m for m in vars(protocol) if not m.startswith("_")} | set(protocol.__annotations__) if protocol else ()
    missing = sorted(m for m in members if not hasattr(part, m))
    if missing:
        raise InvalidEngineArgumentError(
            f"{name} gave a {type(part).__name__}, which lacks {', '.join(missing)} ({protocol.__name__}). Implement "
            "them, or subclass the engine's own part and override only what you change.",
            parameter=name,
            value=factory,
        )
    return part


def _check_pool_names_groups(pool) -> None:
    """A model of several KV cache groups names each block by hash and group: a pool given through block_pool
    must take kv_cache_group_id where the Protocol has it, or one group would be served another's blocks."""
    for method in ("get_cached_block", "cache_full_blocks"):
        params = inspect.signature(getattr(pool, method)).parameters
        if "kv_cache_group_id" not in params and not any(p.kind is p.VAR_KEYWORD for p in params.values()):
            raise InvalidEngineArgumentError(
                f"block_pool gave a {type(pool).__name__} whose {method} takes no kv_cache_group_id, and this model has "
                "sliding-window layers, so several KV cache groups share the pool. Name each block by "
                "make_block_hash_with_group_id(block_hash, kv_cache_group_id) (BlockPoolInterface), or leave "
                "block_pool out for this model.",
                parameter="block_pool",
                value=pool,
            )


def _check_engine_args(args: dict) -> None:
    """Every argument of LLM(...) before anything is built; see InvalidEngineArgumentError."""
    err = InvalidEngineArgumentError
    model = args["model"]
    if model is not None and not isinstance(model, (str, os.PathLike, LlamaForCausalLM)):
        raise err(
            f"model must be a GGUF path, a LlamaForCausalLM or None (the embedded SmolLM2), got a "
            f"{type(model).__name__}.",
            parameter="model",
            value=model,
        )
    device = args["device"]
    if not (isinstance(device, str) and device == "auto"):
        try:
            device = torch.device(device)
        except (RuntimeError, TypeError):
            raise err(
                f"device must be 'auto', 'cpu' or 'cuda' (or a torch.device), got {device!r}.",
                parameter="device",
                value=device,
            ) from None
        if device.type == "cuda" and not torch.cuda.is_available():
            raise err(
                f"device={args['device']!r} asks for CUDA, which this machine does not have. Use 'cpu' or 'auto'.",
                parameter="device",
                value=args["device"],
            )
    if args["dtype"] is not None and not any(args["dtype"] is d for d in _FLOAT_DTYPES):
        raise err(
            f"dtype must be None (the device's default) or one of {_FLOAT_DTYPES}, got {args['dtype']!r}.",
            parameter="dtype",
            value=args["dtype"],
        )
    if args["dtype"] is torch.bfloat16 and not isinstance(model, LlamaForCausalLM):
        device = resolve_device(args["device"])
        if not bf16_supported(device):
            # vLLM's CudaPlatform.check_if_supports_dtype refuses it the same way.
            major, minor = torch.cuda.get_device_capability(device)
            raise err(
                f"dtype=torch.bfloat16 needs compute capability 8.0 (Ampere) or newer; this GPU has "
                f"{major}.{minor}. Use dtype=torch.float16, or None for the device's default.",
                parameter="dtype",
                value=args["dtype"],
            )
    for name in ("enable_prefix_caching", "enforce_eager", "progress", "long_prefill_token_threshold_adaptive"):
        check_bool(err, name, args[name])
    check_int(err, "block_size", args["block_size"], low=1, hint="16 is vLLM's default.")
    check_int(err, "max_num_seqs", args["max_num_seqs"], low=1)
    check_int(err, "max_num_batched_tokens", args["max_num_batched_tokens"], low=1)
    check_int(err, "long_prefill_token_threshold", args["long_prefill_token_threshold"], low=0, hint="0 sets no cap.")
    check_int(err, "kv_cache_memory_bytes", args["kv_cache_memory_bytes"], low=1, none_ok=True)
    check_int(err, "num_gpu_blocks_override", args["num_gpu_blocks_override"], none_ok=True)
    check_real(err, "gpu_memory_utilization", args["gpu_memory_utilization"], low=0.0, high=1.0, low_open=True)
    # A prompt of one token and one new token: the least a request can be.
    check_int(err, "max_model_len", args["max_model_len"], low=2, none_ok=True, hint="None takes the model's own.")
    check_int(err, "max_logprobs", args["max_logprobs"], low=-1, hint="-1 allows the whole vocabulary.")
    check_choice(err, "scheduling_policy", args["scheduling_policy"], ("fcfs", "priority"))
    check_choice(err, "hash_algo", args["hash_algo"], HASH_ALGOS)
    backend = args["attention_backend"]
    if backend is not None and not isinstance(backend, str):
        if not all(callable(getattr(backend, op, None)) for op in ("store_kvcache", "decode", "prefill")):
            raise err(
                "attention_backend must be 'torch', 'triton' or an AttentionBackend (store_kvcache, decode "
                f"and prefill), got a {type(backend).__name__}.",
                parameter="attention_backend",
                value=backend,
            )
    elif backend is not None:
        check_choice(err, "attention_backend", backend, BACKENDS)
    for name in _SEAMS:
        if args[name] is not None and not callable(args[name]):
            what = {
                "hash_block_tokens": "a function (parent_hash, token_ids, extra_keys)",
                "rejection_sampler": "a function (logits, draft_token_ids, params, generators)",
            }.get(name, "a class (or a factory) to build the part from; pass the class itself, not an instance")
            raise err(f"{name} must be {what}, got a {type(args[name]).__name__}.", parameter=name, value=args[name])
    for name in _MANAGER_SEAMS:
        cls, base = args[name], _SEAM_DEFAULTS[name]
        if cls is not None and not (isinstance(cls, type) and issubclass(cls, base)):
            raise err(f"{name} must be a subclass of core.{base.__name__}, got {cls!r}.", parameter=name, value=cls)


class LLM:
    """Load a llama GGUF (the embedded SmolLM2-135M-Instruct by default) and serve it with a paged KV
    cache, prefix caching and continuous batching.

    CPU runs fp32 with the torch attention backend; CUDA runs bf16 (fp16 below compute capability 8.0:
    see default_dtype) with the Triton kernels, and replays
    pure-decode steps from CUDA graphs captured at start-up (`enforce_eager=True` turns that off, as in vLLM).
    The KV pool is sized from `kv_cache_memory_bytes` (CPU default 512 MiB) or, on CUDA, from
    `gpu_memory_utilization` of the memory left after loading the weights (vLLM's default, 0.92, is a share of
    the GPU's whole memory for the instance, weights included). `num_gpu_blocks_override`
    (vLLM's name) gives the pool's block count instead, null block included, whatever the dtype.
    Engines of the same checkpoint, device and dtype share one read-only model; each has its own KV pool.
    `long_prefill_token_threshold` caps one request's chunk while another runs or waits (alone, a request takes
    the whole budget); `long_prefill_token_threshold_adaptive` floors the cap at the budget's fair share, as
    vLLM 0.33's scheduler options of those names do.
    A model with sliding-window layers (`config.layer_types`, or a GGUF's sliding-window metadata) has several
    KV cache groups, each with its own block table; `core.KVCacheManager` serves every model through its
    coordinator, and a sliding group frees the blocks that leave its window while the request runs.

    Every mechanism the course builds enters through its own seam, a Protocol beside the engine's
    implementation; leave an argument out and the engine's own part serves:

    | argument | seam (Protocol) | chapter |
    |---|---|---|
    | `block_table_cls` | `worker.block_table.BlockTableInterface`: slot mapping and block tables | 02 |
    | `attention_backend` | `attention.AttentionBackend`: store, decode and prefill kernels, or "torch"/"triton" | 03 |
    | `hash_block_tokens` | `core.BlockTokensHasher`: the chained block hash | 04 |
    | `free_queue_cls` | `core.FreeBlockQueue`: the free-block queue | 05 |
    | `block_pool` | `core.BlockPoolInterface`, built as `factory(num_blocks, enable_caching)`, plus `free_queue_cls=` when one is given | 06, 09 |
    | `full_attention_manager_cls` | `core.FullAttentionManager` (a subclass): a full-attention group's blocks | 06 |
    | `kv_cache_manager_cls` | `core.KVCacheManagerInterface`, built as `cls(block_size, pool, kv_cache_groups=..., **managers)` | 06 |
    | `scheduler_cls` | `core.sched.interface.SchedulerInterface`, built as `cls(SchedulerConfig, kv_cache_manager)` | 07 |
    | `sliding_window_manager_cls` | `core.SlidingWindowManager` (a subclass): a sliding group's blocks, for models with windows | 12 |
    | `proposer_cls` | `spec_decode.ngram_proposer.NgramProposer`'s `propose(token_ids, k)`, built as `cls(SpeculativeConfig, max_model_len)`; n-gram drafts only (a draft model or an EAGLE head drafts in the runner) | 13 |
    | `rejection_sampler` | `sample.rejection_sampler.rejection_sample`: which drafts a verify step accepts, and the token after | 13 |

    `nanocourse.my_llm()` fills them from the parts a learner has finished.

    Every argument is checked first: a wrong type or a value out of range raises
    InvalidEngineArgumentError naming it, and so does a part that fails to build or lacks a member of its
    seam's Protocol (None takes the engine's own part). `max_logprobs` (vLLM's name and default, 20; -1: no
    cap) bounds what a request's logprobs and prompt_logprobs may ask for.

    `speculative_config` (vLLM's argument and keys) turns on speculative decoding; outputs keep the model's
    distribution (greedy: the same tokens), and None (the default) leaves every step as it is.
    - `{"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": a, "prompt_lookup_max": b}` drafts
      up to k tokens a step by copying what followed the context's last n-gram earlier in the context, and one
      forward pass verifies them all (see config.SpeculativeConfig for the defaults).
    - `{"method": "draft_model", "model": draft, "num_speculative_tokens": k}` drafts k tokens a step greedily
      with a draft model of the target's vocabulary (a GGUF path, or a LlamaForCausalLM). Its layers keep KV in
      the target's blocks, so each block costs both models' layers, and the scheduler reserves k lookahead slots
      past each request's scheduled tokens for the draft passes (vLLM's num_lookahead_tokens). The embedded
      SmolLM2 drafting for itself (`"model": nanoengine.model.loader.embedded_gguf_path()`) shares one copy of
      the weights and has every greedy draft accepted: a check, not a speed-up. Full-attention models only.
    - `{"method": "eagle", "model": head, "num_speculative_tokens": k}` drafts with an EAGLE-1 head built on
      this LLM's model (`model.llama_eagle.EagleLlamaForCausalLM`; nanoengine reads no EAGLE checkpoint, and no
      trained head exists for SmolLM2, so a random one exercises the mechanics). It reads the target's hidden
      states, so CUDA graphs stay off, and a prefix hit drops its last block (vLLM's use_eagle).

    A call owns its requests. When generate(), chat() or stream() ends for any reason (an exception from
    any part, a KeyboardInterrupt, a stream closed or dropped early), the requests it added and has not
    returned are aborted (`LLMEngine.abort_request`): their blocks go back to the pool (full ones stay
    cached) and the next call starts clean. The exception gets a note naming the part that raised.
    """

    def __init__(
        self,
        model: str | os.PathLike | LlamaForCausalLM | None = None,
        *,
        device: str = "auto",
        dtype: torch.dtype | None = None,
        enable_prefix_caching: bool = True,
        block_size: int = 16,
        max_num_seqs: int = 64,
        max_num_batched_tokens: int = 2048,
        long_prefill_token_threshold: int = 0,
        long_prefill_token_threshold_adaptive: bool = False,
        kv_cache_memory_bytes: int | None = None,
        num_gpu_blocks_override: int | None = None,
        gpu_memory_utilization: float = 0.9,
        max_model_len: int | None = None,
        attention_backend: str | AttentionBackend | None = None,
        scheduling_policy: str = "fcfs",
        hash_algo: str = "xxhash",
        hash_block_tokens: BlockTokensHasher | None = None,
        block_pool=None,
        free_queue_cls: type[FreeBlockQueue] | None = None,
        full_attention_manager_cls: type[FullAttentionManager] = FullAttentionManager,
        kv_cache_manager_cls: type[KVCacheManager] = KVCacheManager,
        scheduler_cls: type[SchedulerInterface] = Scheduler,
        block_table_cls: type[BlockTableInterface] = BlockTable,
        sliding_window_manager_cls: type[SlidingWindowManager] = SlidingWindowManager,
        enforce_eager: bool = False,
        max_logprobs: int = 20,
        speculative_config: dict | None = None,
        proposer_cls: type[NgramProposer] = NgramProposer,
        rejection_sampler: Callable = rejection_sample,
        progress: bool = True,
    ):
        _check_engine_args(dict(locals()))
        self.speculative_config = SpeculativeConfig.from_dict(speculative_config)
        self.max_logprobs = max_logprobs
        # None, like leaving the argument out, takes the engine's own part.
        kv_cache_manager_cls, scheduler_cls = kv_cache_manager_cls or KVCacheManager, scheduler_cls or Scheduler
        block_table_cls = block_table_cls or BlockTable
        sliding_window_manager_cls = sliding_window_manager_cls or SlidingWindowManager
        full_attention_manager_cls = full_attention_manager_cls or FullAttentionManager
        proposer_cls, rejection_sampler = proposer_cls or NgramProposer, rejection_sampler or rejection_sample
        if isinstance(model, LlamaForCausalLM):
            # A ready model, e.g. random weights in a test or a course lab: it has no tokenizer, so
            # prompts are token ids and outputs carry no text (vLLM's skip_tokenizer_init).
            self.model_path, self.model, self.config, self.tokenizer = None, model, model.config, None
            weight = next(model.parameters())
            self.device, self.dtype = weight.device, weight.dtype
        else:
            self.model_path, folder = unpacked_folder(model, progress)
            self.config = read_config(folder)
            self.tokenizer = Tokenizer(folder)
            self.device = resolve_device(device)
            self.dtype = dtype or default_dtype(self.device)
            self.model = _shared_model(folder, self.config, self.device, self.dtype)
        backend = attention_backend or ("triton" if self.device.type == "cuda" and triton_available() else "torch")
        self.backend = get_backend(backend) if isinstance(backend, str) else backend
        self.block_size = block_size
        if self.backend.name == "triton" and not is_pow2(block_size, 8):
            raise InvalidEngineArgumentError(
                f"block_size must be a power of two >= 8 for the Triton kernels, got {block_size}. Use 8, 16 or 32, "
                "or attention_backend='torch', which takes any block size.",
                parameter="block_size",
                value=block_size,
            )
        limit = self.config.max_position_embeddings
        if max_model_len is not None and max_model_len > limit:
            raise InvalidEngineArgumentError(
                f"max_model_len={max_model_len} exceeds the model's {limit} positions (max_position_embeddings); "
                f"give at most {limit}, or None for the model's own.",
                parameter="max_model_len",
                value=max_model_len,
            )
        self.max_model_len = max_model_len or limit
        self.draft_model = self._load_draft_model(progress)
        # Computed once here and passed to the paged cache, the KV cache manager and (through the cache) the runner.
        self.kv_cache_groups = groups = kv_cache_groups(self.config)
        hybrid = any(g.sliding_window for g in groups)
        if hybrid:
            self._check_windows(groups, block_size)
        if self.draft_model is not None and (hybrid or self.draft_model.config.sliding_window is not None):
            raise InvalidEngineArgumentError(
                f'speculative_config["method"]="{self.speculative_config.method}" serves full-attention models only: '
                "the draft's KV follows the target's one block table. Use a target and a draft without sliding "
                "windows, or n-gram drafts.",
                parameter="speculative_config",
                value=speculative_config,
            )
        num_blocks = self._num_kv_blocks(kv_cache_memory_bytes, gpu_memory_utilization, num_gpu_blocks_override)
        self._check_fits(num_blocks, kv_cache_memory_bytes, num_gpu_blocks_override)
        self.kv_cache = PagedKVCache(self.config, num_blocks, block_size, self.backend, self.device, self.dtype, groups)
        # A factory of two arguments (chapter 09's policies) still works when no queue is given.
        queue = {} if free_queue_cls is None else {"free_queue_cls": free_queue_cls}
        if hash_block_tokens is not None:  # one block named first: a key the prefix cache can use
            name = _build(
                "hash_block_tokens",
                hash_block_tokens,
                None,
                "(None, token_ids, None)",
                None,
                tuple(range(block_size)),
                None,
            )
            if name is None or not isinstance(name, Hashable):
                raise InvalidEngineArgumentError(
                    f"hash_block_tokens returned {reprlib.repr(name)} for a block; it must return the block's name, "
                    "a hashable value such as bytes.",
                    parameter="hash_block_tokens",
                    value=hash_block_tokens,
                )
        if free_queue_cls:  # a queue of two blocks first, so that a broken queue is named as such
            _build("free_queue_cls", free_queue_cls, FreeBlockQueue, "(blocks)", [KVCacheBlock(0), KVCacheBlock(1)])
        pool = _build(
            "block_pool" if block_pool else None,
            block_pool or BlockPool,
            BlockPoolInterface,
            "(num_blocks, enable_caching)",
            num_blocks,
            enable_prefix_caching,
            **queue,
        )
        if len(groups) > 1 and block_pool is not None:
            _check_pool_names_groups(pool)
        # An EAGLE head's KV at a position depends on the next token, so a prefix hit drops its last block.
        eagle = {"use_eagle": True} if self.speculative_config and self.speculative_config.use_eagle() else {}
        if (
            eagle
            and full_attention_manager_cls.find_longest_cache_hit is not FullAttentionManager.find_longest_cache_hit
        ):
            raise InvalidEngineArgumentError(
                f"{full_attention_manager_cls.__name__}.find_longest_cache_hit is not the engine's, and EAGLE drafts "
                "need it to drop the last hit block when self.use_eagle is set, which chapter 06's contract leaves "
                'out. With speculative_config["method"]="eagle", leave full_attention_manager_cls out (with '
                "nanocourse.my_llm, give full_attention_manager_cls=None).",
                parameter="full_attention_manager_cls",
                value=full_attention_manager_cls,
            )
        kv_manager = _build(
            _given("kv_cache_manager_cls", kv_cache_manager_cls),
            kv_cache_manager_cls,
            KVCacheManagerInterface,
            "(block_size, block_pool, kv_cache_groups=..., ...)",
            block_size,
            pool,
            kv_cache_groups=groups,
            full_attention_manager_cls=full_attention_manager_cls,
            sliding_window_manager_cls=sliding_window_manager_cls,
            **eagle,
        )
        lookahead = self.speculative_config.num_lookahead_tokens if self.speculative_config else 0
        config = SchedulerConfig(
            max_num_batched_tokens,
            max_num_seqs,
            long_prefill_token_threshold,
            scheduling_policy,
            self.max_model_len,
            long_prefill_token_threshold_adaptive,
            lookahead,
        )
        scheduler = _build(
            _given("scheduler_cls", scheduler_cls),
            scheduler_cls,
            SchedulerInterface,
            "(SchedulerConfig, kv_cache_manager)",
            config,
            kv_manager,
        )
        _build(
            _given("block_table_cls", block_table_cls), block_table_cls, BlockTableInterface, "(block_size)", block_size
        )
        # Captured for full attention only, a model with windows runs its steps eagerly; and without an EAGLE head,
        # which needs the hidden states a replay does not give.
        graphs = None
        if (
            not (enforce_eager or hybrid or eagle)
            and self.device.type == "cuda"
            and getattr(self.backend, "supports_cuda_graphs", False)
        ):
            graphs = DecodeGraphs(self.model, self.kv_cache, max_num_seqs, self.max_model_len)
        drafter = (
            None
            if self.draft_model is None
            else (EagleProposer if eagle else DraftModelProposer)(
                self.draft_model,
                PagedKVCache(self.draft_model.config, num_blocks, block_size, self.backend, self.device, self.dtype),
                self.speculative_config,
                self.max_model_len,
            )
        )
        runner = ModelRunner(
            self.model, self.kv_cache, self.device, block_table_cls, graphs, rejection_sampler, drafter
        )
        proposer = None
        if self.speculative_config is not None:
            if not callable(getattr(scheduler, "update_draft_token_ids", None)):
                raise InvalidEngineArgumentError(
                    f"speculative_config needs a scheduler that takes drafts (update_draft_token_ids); "
                    f"{type(scheduler).__name__} has none. Subclass core.sched.scheduler.Scheduler, or leave "
                    "speculative_config out.",
                    parameter="speculative_config",
                    value=speculative_config,
                )
        if self.speculative_config is not None and drafter is None:
            proposer = _build(
                _given("proposer_cls", proposer_cls),
                proposer_cls,
                None,
                "(SpeculativeConfig, max_model_len)",
                self.speculative_config,
                self.max_model_len,
            )
        self.engine = LLMEngine(runner, scheduler, self.tokenizer, hash_algo, hash_block_tokens, proposer)
        self._unclaimed: dict[str, RequestOutput] = {}  # finished requests whose call has not collected them
        # The parts given through seams, by class (or hash function's code), to name one that raises.
        given = {
            "scheduler_cls": type(scheduler),
            "kv_cache_manager_cls": type(kv_manager),
            "block_table_cls": block_table_cls,
            "sliding_window_manager_cls": sliding_window_manager_cls,
            "full_attention_manager_cls": full_attention_manager_cls,
            "block_pool": block_pool and type(pool),
            "free_queue_cls": free_queue_cls,
            "attention_backend": None if isinstance(backend, str) else type(self.backend),
            "hash_block_tokens": getattr(hash_block_tokens, "__code__", type(hash_block_tokens)),
            "proposer_cls": proposer_cls if proposer else None,
            "rejection_sampler": getattr(rejection_sampler, "__code__", type(rejection_sampler)),
        }
        self._parts = {
            part: name
            for name, part in given.items()
            if part is not None and part is not _SEAM_DEFAULTS.get(name) and part is not type(None)
        }
        logger.info(
            "KV cache: %d blocks x %d tokens = %d tokens (%.0f MiB), %s backend on %s",
            num_blocks - 1,
            block_size,
            (num_blocks - 1) * block_size,
            num_blocks * self._bytes_per_block / 2**20,
            self.backend.name,
            self.device,
        )

    def _check_windows(self, groups, block_size) -> None:
        """A model with windows must suit the block size and the context."""
        window = next(g.sliding_window for g in groups if g.sliding_window)
        if window < block_size:
            raise UnsupportedModelError(
                f"sliding_window={window} is below one block of {block_size} tokens. Blocks leave a window whole, so "
                "such a window would hold as many blocks as a window of one block; nanoengine serves windows of at "
                f"least one block. Use block_size <= {window}."
            )
        if window > self.max_model_len:
            raise UnsupportedModelError(
                f"sliding_window={window} exceeds max_model_len={self.max_model_len}: no token could ever leave the "
                "window, so its layers are full attention. Give a smaller window, or full_attention layer types."
            )

    def _load_draft_model(self, progress: bool) -> LlamaForCausalLM | EagleLlamaForCausalLM | None:
        """The draft model of speculative_config's "draft_model" method, on the target's device and dtype, with
        the target's vocabulary and room for max_model_len positions; or the "eagle" method's head, built on
        this target; None for n-gram drafts or none."""
        spec = self.speculative_config
        if spec is None or spec.method == "ngram":
            return None

        def refuse(message: str) -> InvalidEngineArgumentError:
            return InvalidEngineArgumentError(
                f'speculative_config["model"]: {message}', parameter="speculative_config", value=spec.model
            )

        if spec.use_eagle():
            if not isinstance(spec.model, EagleLlamaForCausalLM) or spec.model.target is not self.model:
                raise refuse(
                    "an EAGLE head must be an EagleLlamaForCausalLM built on this LLM's model, e.g. "
                    "EagleLlamaForCausalLM.random(llm.model); nanoengine reads no EAGLE checkpoint, got "
                    f"{reprlib.repr(spec.model)}."
                )
            return spec.model
        if isinstance(spec.model, LlamaForCausalLM):
            draft, weight = spec.model, next(spec.model.parameters())
            if (weight.device.type, weight.dtype) != (self.device.type, self.dtype):
                raise refuse(
                    f"the draft model is on {weight.device} in {weight.dtype}, the target on {self.device} in "
                    f"{self.dtype}; move it with .to(device, dtype) first."
                )
        elif isinstance(spec.model, (str, os.PathLike)):
            try:
                _, folder = unpacked_folder(spec.model, progress)
            except ModelNotFoundError as exc:
                raise refuse(str(exc)) from exc
            draft = _shared_model(folder, read_config(folder), self.device, self.dtype)
        else:
            raise refuse(f"expected a GGUF path or a LlamaForCausalLM, got a {type(spec.model).__name__}.")
        if draft.config.vocab_size != self.config.vocab_size:
            raise refuse(
                f"the draft's vocabulary has {draft.config.vocab_size} tokens and the target's "
                f"{self.config.vocab_size}; a draft must share the target's tokenizer (vLLM refuses it "
                "too unless use_heterogeneous_vocab=True)."
            )
        if draft.config.max_position_embeddings < self.max_model_len:
            raise refuse(
                f"the draft has {draft.config.max_position_embeddings} positions, fewer than "
                f"max_model_len={self.max_model_len}; give max_model_len <= "
                f"{draft.config.max_position_embeddings}."
            )
        return draft

    @property
    def _bytes_per_block(self) -> int:
        """One block id's memory: the target's layers, and the draft model's, which keep KV in the same blocks."""
        size = PagedKVCache.bytes_per_block(self.config, self.block_size, self.dtype, self.kv_cache_groups)
        if self.draft_model is not None:
            size += PagedKVCache.bytes_per_block(self.draft_model.config, self.block_size, self.dtype)
        return size

    def _num_kv_blocks(self, budget: int | None, utilization: float, override: int | None = None) -> int:
        if override is not None:
            num_blocks = override
        else:
            if budget is None and self.device.type == "cuda":
                free, _ = torch.cuda.mem_get_info(self.device)
                budget = int(free * utilization)
            budget = DEFAULT_CPU_KV_BYTES if budget is None else budget
            num_blocks = budget // self._bytes_per_block
        if num_blocks < 2:  # block 0 is the null block, so one usable block needs two
            raise KVCacheTooSmallError(
                f"The KV pool would hold {num_blocks} blocks of {self.block_size} tokens "
                f"({self._bytes_per_block} bytes each); at least two are needed (one is the null block). "
                f"Give num_gpu_blocks_override >= 2 or kv_cache_memory_bytes >= {2 * self._bytes_per_block}."
            )
        return num_blocks

    def _check_fits(self, num_blocks: int, budget: int | None, override: int | None) -> None:
        """Refuse a pool larger than the device before allocating it (torch would fail deep inside, or the
        operating system would end the process once the pages are touched)."""
        size, memory = num_blocks * self._bytes_per_block, _device_memory(self.device)
        if size > memory:
            name = "num_gpu_blocks_override" if override is not None else "kv_cache_memory_bytes"
            raise InvalidEngineArgumentError(
                f"The KV pool would take {size / 2**30:.1f} GiB ({num_blocks} blocks), more than the "
                f"{memory / 2**30:.1f} GiB of memory {self.device} has. Give a smaller {name}.",
                parameter=name,
                value=override if override is not None else budget,
            )

    @property
    def num_kv_tokens(self) -> int:
        """Tokens of one prompt the KV pool can hold (the null block excluded). A hybrid model's token
        takes a block slot in every KV cache group while its prompt is prefilled."""
        return (self.kv_cache.num_blocks - 1) // len(self.kv_cache.groups) * self.block_size

    # ---- requests -----------------------------------------------------------------------------
    def generate(
        self,
        prompts: str | Sequence[str] | None = None,
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        prompt_token_ids: Sequence[int] | Sequence[Sequence[int]] | None = None,
        cache_salt: str | None = None,
        priority: int = 0,
        progress: bool = False,
    ) -> list[RequestOutput]:
        """Complete every prompt together (continuous batching); outputs come back in input order.

        cache_salt isolates these requests' prefix-cache entries from everyone else's (a tenant id);
        priority matters only with scheduling_policy="priority" (lower runs first).
        """
        batch = self._prepare(prompts, prompt_token_ids)
        params = self._params_per_prompt(sampling_params, len(batch))
        check_optional_str(InvalidRequestError, "cache_salt", cache_salt)
        priority = check_int(InvalidRequestError, "priority", priority)
        check_bool(InvalidRequestError, "progress", progress)
        from tqdm.auto import tqdm

        with _Call(self) as call:
            # n > 1: n child requests per prompt; the first to be scheduled caches the prompt's full
            # blocks and the others hit them, so the prompt is held once (vLLM v1 fans out the same way).
            ids = [
                [
                    call.add(tokens, p.child(i), prompt=text, priority=priority, cache_salt=cache_salt)
                    for i in range(p.n)
                ]
                for (text, tokens), p in zip(batch, params)
            ]
            with tqdm(total=sum(map(len, ids)), desc="Generating", unit="req", disable=not progress) as bar:
                while call.pending:
                    bar.update(len(call.step()))
            return [merge_samples([call.done[i] for i in children]) for children in ids]

    def chat(self, messages: list[dict] | str, sampling_params: SamplingParams | None = None) -> RequestOutput:
        """One assistant reply to `messages` ([{"role", "content"}], or a single user string)."""
        return self.generate(self.apply_chat_template(messages), sampling_params)[0]

    def apply_chat_template(self, messages: list[dict] | str) -> str:
        if self.tokenizer is None:
            raise InvalidRequestError("This LLM was built from a model without a tokenizer; it has no chat template.")
        if isinstance(messages, str):
            messages = [{"role": "user", "content": messages}]
        if not (
            isinstance(messages, (list, tuple))
            and messages
            and all(
                isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
                for m in messages
            )
        ):
            raise InvalidRequestError(
                'messages must be a string or a non-empty list of {"role": str, "content": str} dicts, got '
                f"{reprlib.repr(messages)}.",
                parameter="messages",
                value=messages,
            )
        return self.tokenizer.apply_chat_template(list(messages))

    def stream(self, prompt: str, sampling_params: SamplingParams | None = None) -> Iterator[str]:
        """Yield the completion's text piece by piece while the engine steps.

        The arguments are checked now; the request is queued when the first piece is asked for, and
        aborted if the loop stops early (break, close(), or the generator dropped)."""
        if not isinstance(prompt, str):
            raise InvalidRequestError(
                f"stream() takes one prompt string, got {type(prompt).__name__}; use generate() "
                "for several prompts or token ids.",
                parameter="prompt",
                value=prompt,
            )
        ((text, tokens),) = self._prepare(prompt, None)
        (params,) = self._params_per_prompt(sampling_params, 1)
        if params.n != 1:
            raise InvalidRequestError(
                "stream() yields one completion; use generate() for n > 1.", parameter="n", value=params.n
            )
        return self._stream(text, tokens, params)

    def _stream(self, text: str, tokens: list[int], params: SamplingParams) -> Iterator[str]:
        with _Call(self) as call:
            req_id = call.add(tokens, params, prompt=text)
            emitted = ""
            while call.pending:
                call.step()
                current = call.done[req_id].text if req_id in call.done else self.engine.outputs[req_id].text
                if len(current) > len(emitted):
                    yield current[len(emitted) :]
                    emitted = current

    def _failure_note(self, exc: BaseException, num_aborted: int) -> str:
        """What a call's exception gets added: where it came from, and that the engine is whole again."""
        stage = self.engine.stage
        what = "Interrupted" if isinstance(exc, KeyboardInterrupt) else f"{type(exc).__name__} raised"
        where = f" in step {self.engine.stats.num_steps + 1}'s {stage} stage" if stage else ""
        culprit = self._culprit(exc)
        part = f" It came from {culprit[1]}, your part plugged in as LLM({culprit[0]}=...)." if culprit else ""
        return (
            f"nanoengine: {what}{where}.{part} This call's {num_aborted} unfinished request(s) were aborted and "
            "their KV blocks freed; the engine is ready for the next call."
        )

    def _culprit(self, exc: BaseException) -> tuple[str, str] | None:
        """(seam argument, Class.method) of the innermost frame of a part given through a seam, preferring
        the part's own code over engine code it inherits."""
        found = []
        for frame, _ in traceback.walk_tb(exc.__traceback__):
            owner = frame.f_locals.get("self")
            by_class = self._parts.get(type(owner))
            name = by_class or self._parts.get(frame.f_code)
            if name:
                label = f"{type(owner).__name__}.{frame.f_code.co_name}" if by_class else frame.f_code.co_name
                found.append((not frame.f_code.co_filename.startswith(_PACKAGE_DIR), name, label))
        own = [f for f in found if f[0]] or found
        return own[-1][1:] if own else None

    def get_stats(self) -> EngineStats:
        return self.engine.stats

    def reset_prefix_cache(self) -> bool:
        """Drop every cached block; refuses (False) while requests are running."""
        return self.engine.kv_cache_manager.reset_prefix_cache()

    # ---- validation: everything is checked before the first request is queued ------------------
    def _params_per_prompt(self, sampling_params, n: int) -> list[SamplingParams]:
        if sampling_params is None or isinstance(sampling_params, SamplingParams):
            params = [sampling_params or SamplingParams()] * n
        elif (
            isinstance(sampling_params, (list, tuple))
            and len(sampling_params) == n
            and all(isinstance(p, SamplingParams) for p in sampling_params)
        ):
            params = list(sampling_params)
        else:
            raise InvalidRequestError(
                f"Pass one SamplingParams, or a list of {n} (one per prompt).",
                parameter="sampling_params",
                value=sampling_params,
            )
        # replace() checks every field again, so a field changed after construction is caught too.
        params = [dataclasses.replace(p) for p in params]
        cap = self.config.vocab_size if self.max_logprobs == -1 else self.max_logprobs
        for p in params:
            for name in ("logprobs", "prompt_logprobs"):
                k = getattr(p, name)
                if k is not None and (self.config.vocab_size if k == -1 else k) > cap:
                    raise InvalidRequestError(
                        f"{name}={k} asks for more than max_logprobs={self.max_logprobs} logprobs a token. Ask for at "
                        f"most {cap}, or raise the cap with LLM(max_logprobs=...) (-1: the whole vocabulary, as in "
                        "vLLM).",
                        parameter=name,
                        value=k,
                    )
        return params

    def _prepare(self, prompts, prompt_token_ids) -> list[tuple[str | None, list[int]]]:
        if (prompts is None) == (prompt_token_ids is None):
            raise InvalidRequestError("Pass exactly one of prompts (text) or prompt_token_ids.")
        if prompts is not None:
            if self.tokenizer is None:
                raise InvalidRequestError(
                    "This LLM was built from a model without a tokenizer; pass prompt_token_ids=."
                )
            prompts = [prompts] if isinstance(prompts, str) else prompts
            if not isinstance(prompts, (list, tuple)) or not all(isinstance(p, str) for p in prompts):
                raise InvalidRequestError(
                    "prompts must all be strings (one string or a list of them); pass token ids separately via "
                    "prompt_token_ids=.",
                    parameter="prompts",
                    value=prompts,
                )
            for p in prompts:
                try:
                    p.encode("utf-8")
                except UnicodeEncodeError as exc:  # a lone surrogate, which no tokenizer can take
                    raise InvalidRequestError(
                        f"A prompt is not valid Unicode text ({exc.reason} at character {exc.start}); remove or "
                        "replace that character.",
                        parameter="prompts",
                        value=p,
                    ) from None
            batch = [(p, self.tokenizer.encode(p)) for p in prompts]
        else:
            batch = [(None, ids) for ids in _token_id_lists(prompt_token_ids)]
        if not batch:
            raise InvalidRequestError("No prompts given.")
        for _, ids in batch:
            self._validate(ids)
        return batch

    def _validate(self, ids: list[int]) -> None:
        if not ids:
            raise InvalidRequestError("The prompt is empty; give at least one token of text.")
        if len(ids) >= self.max_model_len:
            raise InvalidRequestError(
                f"The prompt has {len(ids)} tokens but max_model_len is {self.max_model_len} (which must "
                "leave room for one new token); shorten the prompt."
            )
        if len(ids) + 1 > self.num_kv_tokens:
            raise InvalidRequestError(
                f"The prompt has {len(ids)} tokens but the whole KV pool holds {self.num_kv_tokens}; "
                "shorten the prompt or raise kv_cache_memory_bytes."
            )
        vocab = self.config.vocab_size
        if not all(_is_token_id(t) and 0 <= t < vocab for t in ids):
            raise InvalidRequestError(f"Token ids must be integers in [0, {vocab}).", parameter="prompt_token_ids")


def _is_token_id(t) -> bool:
    return isinstance(t, numbers.Integral) and not isinstance(t, bool)


def _token_id_lists(prompt_token_ids) -> list[list[int]]:
    """One list of ids, or a list of such lists, as lists of plain ints (numpy integers are welcome)."""
    mix = "prompt_token_ids must be one list of int token ids or a list of such lists, not a mix or other types"
    if hasattr(prompt_token_ids, "tolist"):  # a numpy array or a torch tensor of ids
        prompt_token_ids = prompt_token_ids.tolist()
    if not isinstance(prompt_token_ids, (list, tuple)):
        raise InvalidRequestError(
            f"{mix}; got a {type(prompt_token_ids).__name__}.", parameter="prompt_token_ids", value=prompt_token_ids
        )
    ids = list(prompt_token_ids)
    nested = [ids] if all(map(_is_token_id, ids)) else ids
    if not all(isinstance(x, (list, tuple)) for x in nested):
        raise InvalidRequestError(
            f"{mix}; got {reprlib.repr(prompt_token_ids)}.", parameter="prompt_token_ids", value=prompt_token_ids
        )
    return [[int(t) if _is_token_id(t) else t for t in x] for x in nested]


class _Call:
    """The requests one generate(), chat() or stream() call added, which it alone owns.

    It steps the engine until they finish; finished requests of other calls (a paused stream's) wait in
    LLM._unclaimed for their owner. However the call ends otherwise (an exception from any part, a
    KeyboardInterrupt, a stream closed or dropped early: GeneratorExit), its unfinished requests are
    aborted at once, so the next call neither waits for them nor finds their blocks taken.
    """

    def __init__(self, llm: LLM):
        self.llm, self.engine = llm, llm.engine
        self.pending: set[str] = set()  # added, not finished
        self.done: dict[str, RequestOutput] = {}

    def add(self, prompt_token_ids: list[int], params: SamplingParams, **kwargs) -> str:
        req_id = self.engine.add_request(prompt_token_ids, params, **kwargs)
        self.pending.add(req_id)
        return req_id

    def step(self) -> list[RequestOutput]:
        """One engine step (none if this call's requests have all finished in others' steps); returns this
        call's requests that finished."""
        unclaimed, running = self.llm._unclaimed, self.pending & self.engine.outputs.keys()
        if lost := self.pending - running - unclaimed.keys():
            raise RequestAbortedError(
                f"Request {min(lost)} was aborted while this stream was paused: "
                "a step of another call failed, and a failed step aborts every request it may have left "
                "half-computed. Start the stream again."
            )
        if running:
            unclaimed.update((o.request_id, o) for o in self.engine.step())
        mine = [unclaimed.pop(i) for i in self.pending & unclaimed.keys()]
        self.done.update((o.request_id, o) for o in mine)
        self.pending.difference_update(self.done)
        return mine

    def __enter__(self) -> _Call:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        unfinished = sorted(self.pending)
        for req_id in unfinished:
            self.llm._unclaimed.pop(req_id, None)
        self.engine.abort_request([i for i in unfinished if i in self.engine.outputs])
        if exc is not None and not isinstance(exc, GeneratorExit):
            exc.add_note(self.llm._failure_note(exc, len(unfinished)))
