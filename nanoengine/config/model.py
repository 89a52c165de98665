"""The model's shape (LlamaConfig, read from a GGUF's metadata or made tiny for fast tests) and the settings
of the model an engine serves (ModelConfig, vllm/config/model.py)."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

LAYER_TYPES = ("full_attention", "sliding_attention")


@dataclass(slots=True, frozen=True)
class LlamaConfig:
    """The shape of a Llama-architecture model.

    Field names follow Hugging Face's LlamaConfig, so the two compare side by side.
    Invariants: num_attention_heads is a multiple of num_key_value_heads (GQA groups are whole),
    and hidden_size == num_attention_heads * head_dim.

    Sliding windows follow Hugging Face's Mistral-family names: `layer_types[i]` is "full_attention"
    or "sliding_attention", and a sliding layer's query at position p sees keys p - sliding_window + 1
    .. p. A sliding_window with no layer_types makes every layer sliding, as in Mistral.
    """

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = True
    bos_token_id: int = 1
    eos_token_id: int = 2
    layer_types: tuple[str, ...] | None = None
    sliding_window: int | None = None

    def __post_init__(self) -> None:
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads={self.num_attention_heads} must be a multiple of "
                f"num_key_value_heads={self.num_key_value_heads}"
            )
        if self.hidden_size != self.num_attention_heads * self.head_dim:
            raise ValueError(
                f"hidden_size={self.hidden_size} != num_attention_heads*head_dim="
                f"{self.num_attention_heads * self.head_dim}"
            )
        if self.layer_types is not None:
            object.__setattr__(self, "layer_types", tuple(self.layer_types))
            if len(self.layer_types) != self.num_hidden_layers or not set(self.layer_types) <= set(LAYER_TYPES):
                raise ValueError(
                    f"layer_types must name {self.num_hidden_layers} layers, each one of {LAYER_TYPES}; "
                    f"got {self.layer_types}"
                )
            if "sliding_attention" in self.layer_types and self.sliding_window is None:
                raise ValueError("layer_types has sliding_attention layers but sliding_window is not set")
        if self.sliding_window is not None and self.sliding_window < 1:
            raise ValueError(f"sliding_window={self.sliding_window} must be at least 1 token")

    def window(self, layer_idx: int) -> int | None:
        """The layer's sliding window in tokens, or None for full attention."""
        if self.sliding_window is None:
            return None
        if self.layer_types is None or self.layer_types[layer_idx] == "sliding_attention":
            return self.sliding_window
        return None

    @property
    def num_queries_per_kv(self) -> int:
        return self.num_attention_heads // self.num_key_value_heads

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """K and V bytes one token occupies across all layers."""
        return 2 * self.num_hidden_layers * self.num_key_value_heads * self.head_dim * dtype_bytes

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def to_hf(self):
        """The same shape as a Hugging Face config (transformers is a test extra): LlamaConfig, or, with
        sliding windows, MinistralConfig, a Llama with per-layer windows."""
        import transformers

        d = self.to_dict()
        layer_types, window = d.pop("layer_types"), d.pop("sliding_window")
        if window is None:
            return transformers.LlamaConfig(**d)
        types = list(layer_types) if layer_types else ["sliding_attention"] * self.num_hidden_layers
        return transformers.MinistralConfig(**d, layer_types=types, sliding_window=window)

    @classmethod
    def from_dict(cls, d: dict) -> LlamaConfig:
        return cls(**{f.name: d[f.name] for f in dataclasses.fields(cls) if f.name in d})

    @classmethod
    def from_gguf_metadata(cls, meta: dict, has_output_weight: bool) -> LlamaConfig:
        """Build from llama.cpp's `llama.*` keys (the caller has checked the architecture)."""
        n_heads = int(meta["llama.attention.head_count"])
        hidden = int(meta["llama.embedding_length"])
        return cls(
            vocab_size=int(meta.get("llama.vocab_size", meta["_num_tokens"])),
            hidden_size=hidden,
            intermediate_size=int(meta["llama.feed_forward_length"]),
            num_hidden_layers=int(meta["llama.block_count"]),
            num_attention_heads=n_heads,
            num_key_value_heads=int(meta.get("llama.attention.head_count_kv", n_heads)),
            head_dim=hidden // n_heads,
            rope_theta=float(meta.get("llama.rope.freq_base", 10000.0)),
            rms_norm_eps=float(meta["llama.attention.layer_norm_rms_epsilon"]),
            max_position_embeddings=int(meta.get("llama.context_length", 2048)),
            tie_word_embeddings=not has_output_weight,
            bos_token_id=int(meta.get("tokenizer.ggml.bos_token_id", 1)),
            eos_token_id=int(meta.get("tokenizer.ggml.eos_token_id", 2)),
        )

    @classmethod
    def smollm2_135m(cls) -> LlamaConfig:
        """The embedded SmolLM2-135M-Instruct's shape: random weights in it cost what the real ones do,
        for benchmarks and GPU tests on machines without the model package."""
        return cls(
            vocab_size=49152,
            hidden_size=576,
            intermediate_size=1536,
            num_hidden_layers=30,
            num_attention_heads=9,
            num_key_value_heads=3,
            head_dim=64,
            rope_theta=100000.0,
            rms_norm_eps=1e-5,
            max_position_embeddings=8192,
        )

    @classmethod
    def tiny(cls, **overrides) -> LlamaConfig:
        """A random-weight model small enough for unit tests, with SmolLM2's odd GQA group of 3."""
        base = {
            "vocab_size": 256,
            "hidden_size": 48,
            "intermediate_size": 96,
            "num_hidden_layers": 2,
            "num_attention_heads": 6,
            "num_key_value_heads": 2,
            "head_dim": 8,
            "rope_theta": 10000.0,
            "max_position_embeddings": 512,
        }
        base.update(overrides)
        return cls(**base)

    @classmethod
    def tiny_hybrid(cls, sliding_window: int = 24, **overrides) -> LlamaConfig:
        """tiny() with four layers, three sliding to one full, the ratio of Gemma-3-like hybrids."""
        layers = ("sliding_attention",) * 3 + ("full_attention",)
        return cls.tiny(num_hidden_layers=4, layer_types=layers, sliding_window=sliding_window, **overrides)


@dataclass(slots=True, frozen=True, kw_only=True)
class ModelConfig:
    """The model an engine serves, resolved (vllm/config/model.py's ModelConfig, the subset nanoengine has).

    model: as given: a GGUF path, None for the embedded SmolLM2, or a ready LlamaForCausalLM (random weights in
    a test), which has no tokenizer, so its prompts are token ids and its outputs carry no text (vLLM's
    skip_tokenizer_init). folder: where the GGUF was unpacked (None for a ready model), model_path the GGUF file.
    hf_config: the model's shape. device and dtype: where and in what the weights run (a ready model's own).
    max_model_len: the longest a request may grow, at most hf_config.max_position_embeddings.
    max_logprobs: the most logprobs a token may ask for (-1: the whole vocabulary), vLLM's default 20.
    enforce_eager: never replay CUDA graphs. progress: show a bar while a GGUF is unpacked the first time.
    quantization: None (the weights in dtype) or a key of model.llama.QUANTIZATION_METHODS (CPU only).
    """

    model: str | os.PathLike | torch.nn.Module | None  # a LlamaForCausalLM when ready
    model_path: Path | None
    folder: Path | None
    hf_config: LlamaConfig
    device: torch.device
    dtype: torch.dtype
    max_model_len: int
    max_logprobs: int = 20
    enforce_eager: bool = False
    progress: bool = True
    quantization: str | None = None
