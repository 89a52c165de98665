"""The user-facing engine: LLM(...).generate(prompts, SamplingParams(...)) (vllm/entrypoints/llm.py)."""

from __future__ import annotations

import dataclasses
import logging
import os
import weakref
from collections.abc import Iterator, Sequence

import torch

from nanoengine.attention import AttentionBackend, get_backend, triton_available
from nanoengine.attention.paged import PagedKVCache, kv_cache_groups
from nanoengine.core import (
    BlockPool,
    BlockTokensHasher,
    FreeBlockQueue,
    HybridKVCacheManager,
    KVCacheManager,
    SlidingWindowManager,
)
from nanoengine.cuda_graphs import DecodeGraphs
from nanoengine.engine import EngineStats, LLMEngine
from nanoengine.errors import InvalidRequestError, KVCacheTooSmallError, UnsupportedModelError
from nanoengine.model import LlamaForCausalLM
from nanoengine.model_loader import read_config, read_weights, unpacked_folder
from nanoengine.model_runner import BlockTable, BlockTableInterface, ModelRunner
from nanoengine.outputs import RequestMetrics, RequestOutput
from nanoengine.sampling_params import SamplingParams
from nanoengine.scheduler import Scheduler, SchedulerConfig, SchedulerInterface
from nanoengine.tokenizer import Tokenizer

logger = logging.getLogger("nanoengine")

DEFAULT_CPU_KV_BYTES = 512 * 2**20

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
        metrics=RequestMetrics(min(t.arrival_time for t in times), min(t.first_token_time for t in times),
                               max(t.finish_time for t in times)),
    )


class LLM:
    """Load a llama GGUF (the embedded SmolLM2-135M-Instruct by default) and serve it with a paged KV
    cache, prefix caching and continuous batching.

    CPU runs fp32 with the torch attention backend; CUDA runs bf16 with the Triton kernels, and replays
    pure-decode steps from CUDA graphs captured at start-up (`enforce_eager=True` turns that off, as in vLLM).
    The KV pool is sized from `kv_cache_memory_bytes` (CPU default 512 MiB) or, on CUDA, from
    `gpu_memory_utilization` of the memory left after loading the weights. `num_gpu_blocks_override`
    (vLLM's name) gives the pool's block count instead, null block included, whatever the dtype.
    Engines of the same checkpoint, device and dtype share one read-only model; each has its own KV pool.
    A model with sliding-window layers (`config.layer_types`) runs on `core.HybridKVCacheManager`: its layers
    form KV cache groups, each with its own block table, and a sliding group frees the blocks that leave its
    window while the request runs.

    Every mechanism the course builds enters through its own seam, a Protocol beside the engine's
    implementation; leave an argument out and the engine's own part serves:

    | argument | seam (Protocol) | chapter |
    |---|---|---|
    | `block_table_cls` | `model_runner.BlockTableInterface`: slot mapping and block tables | 02 |
    | `attention_backend` | `attention.AttentionBackend`: store, decode and prefill kernels, or "torch"/"triton" | 03 |
    | `hash_block_tokens` | `core.BlockTokensHasher`: the chained block hash | 04 |
    | `free_queue_cls` | `core.FreeBlockQueue`: the free-block queue | 05 |
    | `block_pool` | `core.BlockPoolInterface`, built as `factory(num_blocks, enable_caching)`, plus `free_queue_cls=` when one is given | 06, 09 |
    | `kv_cache_manager_cls` | `core.KVCacheManagerInterface`, built as `cls(block_size, pool)` | 06 |
    | `scheduler_cls` | `scheduler.SchedulerInterface`, built as `cls(SchedulerConfig, kv_cache_manager)` | 07 |
    | `sliding_window_manager_cls` | `core.SlidingWindowManager` (a subclass): a sliding group's blocks, for models with windows | 12 |

    `nanoengine.course.my_llm()` fills them from the parts a learner has finished.
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
        kv_cache_manager_cls: type[KVCacheManager] = KVCacheManager,
        scheduler_cls: type[SchedulerInterface] = Scheduler,
        block_table_cls: type[BlockTableInterface] = BlockTable,
        sliding_window_manager_cls: type[SlidingWindowManager] = SlidingWindowManager,
        enforce_eager: bool = False,
        progress: bool = True,
    ):
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
            self.dtype = dtype or (torch.bfloat16 if self.device.type == "cuda" else torch.float32)
            self.model = _shared_model(folder, self.config, self.device, self.dtype)
        backend = attention_backend or ("triton" if self.device.type == "cuda" and triton_available() else "torch")
        self.backend = get_backend(backend) if isinstance(backend, str) else backend
        self.block_size = block_size

        self.max_model_len = min(max_model_len or self.config.max_position_embeddings, self.config.max_position_embeddings)
        groups = kv_cache_groups(self.config)
        hybrid = any(g.sliding_window for g in groups)
        if hybrid:
            self._check_windows(groups, block_size, block_pool, kv_cache_manager_cls, scheduler_cls, block_table_cls)
        num_blocks = self._num_kv_blocks(kv_cache_memory_bytes, gpu_memory_utilization, num_gpu_blocks_override)
        self.kv_cache = PagedKVCache(self.config, num_blocks, block_size, self.backend, self.device, self.dtype, groups)
        # A factory of two arguments (chapter 09's policies) still works when no queue is given.
        queue = {} if free_queue_cls is None else {"free_queue_cls": free_queue_cls}
        pool = (block_pool or BlockPool)(num_blocks, enable_prefix_caching, **queue)
        if hybrid:
            kv_manager = HybridKVCacheManager(block_size, pool, groups,
                                              sliding_window_manager_cls=sliding_window_manager_cls)
        else:
            kv_manager = kv_cache_manager_cls(block_size, pool)
        scheduler = scheduler_cls(
            SchedulerConfig(max_num_batched_tokens, max_num_seqs, long_prefill_token_threshold,
                            scheduling_policy, self.max_model_len),
            kv_manager,
        )
        graphs = None  # captured for full attention only; a model with windows runs its steps eagerly
        if not (enforce_eager or hybrid) and self.device.type == "cuda" and getattr(self.backend, "supports_cuda_graphs", False):
            graphs = DecodeGraphs(self.model, self.kv_cache, max_num_seqs, self.max_model_len)
        runner = ModelRunner(self.model, self.kv_cache, self.device, block_table_cls, graphs)
        self.engine = LLMEngine(runner, scheduler, self.tokenizer, hash_algo, hash_block_tokens)
        logger.info(
            "KV cache: %d blocks x %d tokens = %d tokens (%.0f MiB), %s backend on %s",
            num_blocks - 1, block_size, (num_blocks - 1) * block_size,
            num_blocks * self._bytes_per_block / 2**20, self.backend.name, self.device,
        )

    def _check_windows(self, groups, block_size, *seams) -> None:
        """A model with windows must suit the block size and the context, and it runs on the engine's own
        pool, manager, scheduler and block table, which know KV cache groups (one group too, when every
        layer slides)."""
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
        defaults = (None, KVCacheManager, Scheduler, BlockTable)
        if any(seam is not default for seam, default in zip(seams, defaults)):
            raise UnsupportedModelError(
                f"This model has sliding-window layers ({len(groups)} KV cache group(s)), which only the engine's own "
                "block pool, KV cache manager, scheduler and block table serve: leave block_pool, "
                "kv_cache_manager_cls, scheduler_cls and block_table_cls out for it."
            )

    @property
    def _bytes_per_block(self) -> int:
        return PagedKVCache.bytes_per_block(self.config, self.block_size, self.dtype)

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
        # n > 1: n child requests per prompt; the first to be scheduled caches the prompt's full
        # blocks and the others hit them, so the prompt is held once (vLLM v1 fans out the same way).
        ids = [[self.engine.add_request(tokens, p.child(i), prompt=text, priority=priority, cache_salt=cache_salt)
                for i in range(p.n)] for (text, tokens), p in zip(batch, params)]
        done: dict[str, RequestOutput] = {}
        from tqdm.auto import tqdm

        with tqdm(total=sum(map(len, ids)), desc="Generating", unit="req", disable=not progress) as bar:
            while self.engine.has_unfinished_requests():
                finished = self.engine.step()
                done.update((o.request_id, o) for o in finished)
                bar.update(len(finished))
        return [merge_samples([done[i] for i in children]) for children in ids]

    def chat(self, messages: list[dict] | str, sampling_params: SamplingParams | None = None) -> RequestOutput:
        """One assistant reply to `messages` ([{"role", "content"}], or a single user string)."""
        return self.generate(self.apply_chat_template(messages), sampling_params)[0]

    def apply_chat_template(self, messages: list[dict] | str) -> str:
        if self.tokenizer is None:
            raise InvalidRequestError("This LLM was built from a model without a tokenizer; it has no chat template.")
        if isinstance(messages, str):
            messages = [{"role": "user", "content": messages}]
        return self.tokenizer.apply_chat_template(messages)

    def stream(self, prompt: str, sampling_params: SamplingParams | None = None) -> Iterator[str]:
        """Yield the completion's text piece by piece while the engine steps."""
        (text, tokens), = self._prepare(prompt, None)
        params = sampling_params or SamplingParams()
        if params.n != 1:
            raise InvalidRequestError("stream() yields one completion; use generate() for n > 1.")
        req_id = self.engine.add_request(tokens, params, prompt=text)
        emitted = ""
        while True:
            finished = {o.request_id: o for o in self.engine.step()}
            current = finished[req_id].text if req_id in finished else self.engine.outputs[req_id].text
            if len(current) > len(emitted):
                yield current[len(emitted):]
                emitted = current
            if req_id in finished:
                return

    def get_stats(self) -> EngineStats:
        return self.engine.stats

    def reset_prefix_cache(self) -> bool:
        """Drop every cached block; refuses (False) while requests are running."""
        return self.engine.kv_cache_manager.reset_prefix_cache()

    # ---- validation: everything is checked before the first request is queued ------------------
    @staticmethod
    def _params_per_prompt(sampling_params, n: int) -> list[SamplingParams]:
        if sampling_params is None or isinstance(sampling_params, SamplingParams):
            return [sampling_params or SamplingParams()] * n
        params = list(sampling_params)
        if len(params) != n or not all(isinstance(p, SamplingParams) for p in params):
            raise InvalidRequestError(f"Pass one SamplingParams, or a list of {n} (one per prompt).")
        return params

    def _prepare(self, prompts, prompt_token_ids) -> list[tuple[str | None, list[int]]]:
        if (prompts is None) == (prompt_token_ids is None):
            raise InvalidRequestError("Pass exactly one of prompts (text) or prompt_token_ids.")
        if prompts is not None:
            if self.tokenizer is None:
                raise InvalidRequestError("This LLM was built from a model without a tokenizer; pass prompt_token_ids=.")
            prompts = [prompts] if isinstance(prompts, str) else list(prompts)
            if not all(isinstance(p, str) for p in prompts):
                raise InvalidRequestError(
                    "prompts must all be strings; pass token ids separately via prompt_token_ids=."
                )
            batch = [(p, self.tokenizer.encode(p)) for p in prompts]
        else:
            ids = list(prompt_token_ids)
            nested = [ids] if all(isinstance(t, int) for t in ids) else ids
            if not all(isinstance(x, (list, tuple)) for x in nested):
                raise InvalidRequestError(
                    "prompt_token_ids must be one list of ints or a list of such lists, not a mix."
                )
            batch = [(None, list(x)) for x in nested]
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
        if not all(isinstance(t, int) and 0 <= t < vocab for t in ids):
            raise InvalidRequestError(f"Token ids must be integers in [0, {vocab}).")
