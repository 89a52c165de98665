"""The worker: the model on its device, the KV cache sized and allocated, the runner built
(vllm/v1/worker/gpu_worker.py's Worker: load_model, determine_available_memory, initialize_from_config).

vLLM's worker runs in a process of its own per GPU; nanoengine's is an object in the engine's process.
"""

from __future__ import annotations

import logging
import os
import reprlib
import weakref
from pathlib import Path

import torch

from nanoengine.attention.paged import PagedKVCache
from nanoengine.config.engine import EngineConfig
from nanoengine.config.model import LlamaConfig
from nanoengine.errors import InvalidEngineArgumentError, KVCacheTooSmallError, ModelNotFoundError
from nanoengine.kv_cache_interface import KVCacheConfig
from nanoengine.model import LlamaForCausalLM
from nanoengine.model.llama import QUANTIZATION_METHODS
from nanoengine.model.llama_eagle import EagleLlamaForCausalLM
from nanoengine.model.loader import read_config, read_weights, unpacked_folder
from nanoengine.parts import build_part
from nanoengine.spec_decode.draft_model import DraftModelProposer
from nanoengine.spec_decode.eagle import EagleProposer
from nanoengine.worker.block_table import BlockTableInterface
from nanoengine.worker.cuda_graphs import DecodeGraphs
from nanoengine.worker.model_runner import ModelRunner

logger = logging.getLogger("nanoengine")
DEFAULT_CPU_KV_BYTES = 512 * 2**20

# Inference never writes the weights, so engines built from one checkpoint on one device and dtype share a
# single model: several engines of one process pay for the weights once. The entry goes when the last engine
# using it does.
_MODELS: weakref.WeakValueDictionary[tuple, LlamaForCausalLM] = weakref.WeakValueDictionary()


def load_model(
    folder: Path, config: LlamaConfig, device: torch.device, dtype: torch.dtype, quantization: str | None = None
) -> LlamaForCausalLM:
    """The model of an unpacked checkpoint on device in dtype, quantized by the QUANTIZATION_METHODS entry named
    (None: not at all), shared with every engine that loaded it so."""
    model = _MODELS.get((folder, device, dtype, quantization))
    if model is None:
        # A quantization method starts from fp32, where a GGUF's 4-bit groups are still exact.
        load_dtype = dtype if quantization is None else torch.float32
        model = LlamaForCausalLM.from_state_dict(config, read_weights(folder), device, load_dtype)
        if quantization is not None:
            model = QUANTIZATION_METHODS[quantization](model, dtype)
        _MODELS[folder, device, dtype, quantization] = model
    return model


def device_memory(device: torch.device) -> int:
    """All the memory of the device (a GPU's total, the machine's physical memory on a CPU)."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[1]
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):  # Windows has no sysconf
        return 2**62


def num_kv_blocks(
    bytes_per_block: int,
    device: torch.device,
    budget: int | None,
    utilization: float,
    override: int | None = None,
) -> int:
    """The pool's size in blocks, the null block included: `override` when given, else a byte budget's whole
    blocks, the budget being `budget`, or on CUDA `utilization` of the memory free now, or on a CPU 512 MiB.
    Raises KVCacheTooSmallError below two blocks (block 0 is the null block, so one usable block needs two)."""
    if override is not None:
        num_blocks = override
    else:
        if budget is None and device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(device)
            budget = int(free * utilization)
        budget = DEFAULT_CPU_KV_BYTES if budget is None else budget
        num_blocks = budget // bytes_per_block
    if num_blocks < 2:
        raise KVCacheTooSmallError(
            f"The KV pool would hold {num_blocks} blocks ({bytes_per_block} bytes each); at least two are needed "
            f"(one is the null block). Give num_gpu_blocks_override >= 2 or kv_cache_memory_bytes >= "
            f"{2 * bytes_per_block}."
        )
    return num_blocks


class Worker:
    """One engine's model, draft model and KV cache on one device, and the runner over them.

    Invariant: the target's and the draft model's KV share block ids, so one block costs both models' layers
    (bytes_per_block), and the pool holds num_blocks of them, the null block included.
    """

    def __init__(self, config: EngineConfig):
        self.config = config
        mc = config.model_config
        self.device, self.dtype = mc.device, mc.dtype
        if isinstance(mc.model, LlamaForCausalLM):
            self.model = mc.model
        else:
            assert mc.folder is not None
            self.model = load_model(mc.folder, mc.hf_config, mc.device, mc.dtype, mc.quantization)
        self.draft_model = self._load_draft_model()
        self.backend = config.parts.attention_backend
        self.kv_cache: PagedKVCache | None = None

    @property
    def bytes_per_block(self) -> int:
        """One block id's memory: the target's layers, and the draft model's, which keep KV in the same blocks."""
        block_size, dtype = self.config.cache_config.block_size, self.dtype
        size = PagedKVCache.bytes_per_block(
            self.config.model_config.hf_config, block_size, dtype, list(self.config.kv_cache_groups)
        )
        if self.draft_model is not None:
            size += PagedKVCache.bytes_per_block(self.draft_model.config, block_size, dtype)
        return size

    def get_kv_cache_config(self) -> KVCacheConfig:
        """The pool's blocks and groups, refused before allocating when the device cannot hold them (torch would
        fail deep inside, or the operating system would end the process once the pages are touched)."""
        cc = self.config.cache_config
        num_blocks = num_kv_blocks(
            self.bytes_per_block, self.device, cc.kv_cache_memory_bytes, cc.gpu_memory_utilization,
            cc.num_gpu_blocks_override,
        )  # fmt: skip
        size, memory = num_blocks * self.bytes_per_block, device_memory(self.device)
        if size > memory:
            name = "num_gpu_blocks_override" if cc.num_gpu_blocks_override is not None else "kv_cache_memory_bytes"
            raise InvalidEngineArgumentError(
                f"The KV pool would take {size / 2**30:.1f} GiB ({num_blocks} blocks), more than the "
                f"{memory / 2**30:.1f} GiB of memory {self.device} has. Give a smaller {name}.",
                parameter=name,
                value=getattr(cc, name),
            )
        return KVCacheConfig(num_blocks=num_blocks, kv_cache_groups=self.config.kv_cache_groups)

    def initialize_from_config(self, kv_cache_config: KVCacheConfig) -> ModelRunner:
        """Allocate the KV cache, capture the CUDA graphs and build the runner over them."""
        config, parts = self.config, self.config.parts
        block_size, num_blocks = config.cache_config.block_size, kv_cache_config.num_blocks
        groups = list(kv_cache_config.kv_cache_groups)
        self.kv_cache = PagedKVCache(
            config.model_config.hf_config, num_blocks, block_size, self.backend, self.device, self.dtype, groups
        )
        build_part(
            parts.named("block_table_cls"), parts.block_table_cls, BlockTableInterface, "(block_size)", block_size
        )
        graphs = None
        # Captured for full attention only (a model with windows runs its steps eagerly), and without an EAGLE
        # head, which needs the hidden states a replay does not give.
        if (
            not (config.model_config.enforce_eager or len(groups) > 1 or config.use_eagle)
            and self.device.type == "cuda"
            and self.backend.supports_cuda_graphs
        ):
            graphs = DecodeGraphs(
                self.model, self.kv_cache, config.scheduler_config.max_num_seqs, config.model_config.max_model_len
            )
        drafter = None
        if self.draft_model is not None:
            assert config.speculative_config is not None
            draft_cache = PagedKVCache(
                self.draft_model.config, num_blocks, block_size, self.backend, self.device, self.dtype
            )
            drafter = (EagleProposer if config.use_eagle else DraftModelProposer)(
                self.draft_model, draft_cache, config.speculative_config, config.model_config.max_model_len
            )
        logger.info(
            "KV cache: %d blocks x %d tokens = %d tokens (%.0f MiB), %s backend on %s",
            num_blocks - 1,
            block_size,
            (num_blocks - 1) * block_size,
            num_blocks * self.bytes_per_block / 2**20,
            self.backend.name,
            self.device,
        )
        return ModelRunner(
            self.model, self.kv_cache, self.device, parts.block_table_cls, graphs, parts.rejection_sampler, drafter
        )

    def _load_draft_model(self) -> LlamaForCausalLM | EagleLlamaForCausalLM | None:
        """The draft model of speculative_config's "draft_model" method, on the target's device and dtype, with
        the target's vocabulary and room for max_model_len positions; or the "eagle" method's head, built on
        this target; None for n-gram drafts or none."""
        spec, mc = self.config.speculative_config, self.config.model_config
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
                _, folder = unpacked_folder(spec.model, mc.progress)
            except ModelNotFoundError as exc:
                raise refuse(str(exc)) from exc
            draft = load_model(folder, read_config(folder), self.device, self.dtype)
        else:
            raise refuse(f"expected a GGUF path or a LlamaForCausalLM, got a {type(spec.model).__name__}.")
        if draft.config.sliding_window is not None:
            raise refuse(
                "the draft model has sliding-window layers, and drafts serve full-attention models only: a "
                "draft's KV follows the target's one block table."
            )
        if draft.config.vocab_size != mc.hf_config.vocab_size:
            raise refuse(
                f"the draft's vocabulary has {draft.config.vocab_size} tokens and the target's "
                f"{mc.hf_config.vocab_size}; a draft must share the target's tokenizer (vLLM refuses it "
                "too unless use_heterogeneous_vocab=True)."
            )
        if draft.config.max_position_embeddings < mc.max_model_len:
            raise refuse(
                f"the draft has {draft.config.max_position_embeddings} positions, fewer than "
                f"max_model_len={mc.max_model_len}; give max_model_len <= "
                f"{draft.config.max_position_embeddings}."
            )
        return draft
