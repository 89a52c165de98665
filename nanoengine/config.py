"""Model configuration: read from a GGUF's metadata, or made tiny for fast tests."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from nanoengine.errors import InvalidEngineArgumentError
from nanoengine.validation import check_choice, check_int

LAYER_TYPES = ("full_attention", "sliding_attention")


@dataclass(slots=True, frozen=True)
class LlamaConfig:
    """The shape of a Llama-architecture model.

    Field names follow Hugging Face's LlamaConfig so a learner can compare the two side by side.
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


SPECULATIVE_METHODS = ("ngram", "draft_model", "eagle")


def _speculative_error(message: str, *, parameter: str | None = None, value=None) -> InvalidEngineArgumentError:
    """Every bad key or value of the dict is reported against the engine argument that carried it."""
    return InvalidEngineArgumentError(message, parameter="speculative_config", value=value)


@dataclass(slots=True, frozen=True)
class SpeculativeConfig:
    """Speculative decoding (vllm/config/speculative.py's SpeculativeConfig, its n-gram, draft-model and EAGLE
    subset).

    method: "ngram" (prompt lookup: drafts are copied from the request's own context, no draft model),
    "draft_model" (a smaller model with the target's vocabulary drafts greedily, keeping its own KV in the
    target's blocks) or "eagle" (an EAGLE-1 head reads the target's hidden states; its KV too sits in the
    target's blocks).
    num_speculative_tokens: k, the most draft tokens verified per request and step (required, as in vLLM
    unless the draft checkpoint sets n_predict).
    model: for "draft_model", a GGUF path (as LLM's model argument) or a ready LlamaForCausalLM (random weights
    in tests); for "eagle", an EagleLlamaForCausalLM built on the target (nanoengine reads no EAGLE checkpoint).
    prompt_lookup_min / prompt_lookup_max: for "ngram" only, the n-gram lengths matched, longest first.
    vLLM's defaults: both 5 when neither is given, and one given alone stands for both.
    Invariant (checked here, InvalidEngineArgumentError naming speculative_config otherwise):
    1 <= num_speculative_tokens; "draft_model" and "eagle" have a model and no prompt_lookup keys; "ngram" has
    no model and 1 <= prompt_lookup_min <= prompt_lookup_max.
    """

    num_speculative_tokens: int
    method: str = "ngram"
    prompt_lookup_min: int | None = None
    prompt_lookup_max: int | None = None
    model: object = None

    def __post_init__(self) -> None:
        err = _speculative_error
        check_choice(err, 'speculative_config["method"]', self.method, SPECULATIVE_METHODS)
        object.__setattr__(
            self,
            "num_speculative_tokens",
            check_int(
                err,
                'speculative_config["num_speculative_tokens"]',
                self.num_speculative_tokens,
                low=1,
                hint="It is the most draft tokens verified per step; 2 to 5 suit n-gram drafts.",
            ),
        )
        if self.method != "ngram":
            self._check_model()
            return
        if self.model is not None:
            raise err(
                'speculative_config["model"] names a draft model, which the "ngram" method does not use; '
                'give "method": "draft_model" (or "eagle" for an EAGLE head) to draft with it, or leave '
                '"model" out.',
                value=self.model,
            )
        for key in ("prompt_lookup_min", "prompt_lookup_max"):
            object.__setattr__(
                self, key, check_int(err, f'speculative_config["{key}"]', getattr(self, key), low=1, none_ok=True)
            )
        lo, hi = self.prompt_lookup_min, self.prompt_lookup_max
        object.__setattr__(self, "prompt_lookup_min", 5 if lo is None and hi is None else lo or hi)
        object.__setattr__(self, "prompt_lookup_max", hi or self.prompt_lookup_min)
        if self.prompt_lookup_min > self.prompt_lookup_max:
            raise err(
                f'speculative_config["prompt_lookup_min"]={self.prompt_lookup_min} must be <= '
                f'speculative_config["prompt_lookup_max"]={self.prompt_lookup_max}; swap them or give one '
                "of them only.",
                value=self.prompt_lookup_min,
            )

    def _check_model(self) -> None:
        if self.model is None:
            what = (
                "the draft model's GGUF path (for the embedded SmolLM2 drafting for itself, "
                "nanoengine.model.loader.embedded_gguf_path()) or a LlamaForCausalLM"
                if self.method == "draft_model"
                else "an EAGLE head on the target, e.g. nanoengine.model.llama_eagle.EagleLlamaForCausalLM.random(llm.model)"
            )
            raise _speculative_error(
                f'speculative_config["method"]="{self.method}" needs "model": {what}.', value=self.model
            )
        given = [key for key in ("prompt_lookup_min", "prompt_lookup_max") if getattr(self, key) is not None]
        if given:
            raise _speculative_error(
                f'speculative_config{given} are n-gram lengths, which "{self.method}" does not '
                'use; leave them out, or give "method": "ngram".',
                value=self.method,
            )

    def use_eagle(self) -> bool:
        """Whether the drafter reads the target's hidden states, so a prefix hit drops its last block (vLLM's
        use_eagle, and needs_eagle_block_drop for its EAGLE-1 case)."""
        return self.method == "eagle"

    @property
    def num_lookahead_tokens(self) -> int:
        """KV slots to reserve past the tokens the target is scheduled for (vLLM's VllmConfig property): a draft
        model or an EAGLE head writes its own KV for the drafts it feeds itself, k of them at most; n-gram drafts
        write none."""
        return 0 if self.method == "ngram" else self.num_speculative_tokens

    @classmethod
    def from_dict(cls, config: dict | None) -> SpeculativeConfig | None:
        """LLM(speculative_config=...)'s dict (vLLM's keys), or None: speculative decoding off."""
        if config is None:
            return None
        keys = sorted(f.name for f in dataclasses.fields(cls))
        if not isinstance(config, dict):
            raise _speculative_error(
                f"speculative_config must be None or a dict with the keys {keys}, got a {type(config).__name__}.",
                value=config,
            )
        unknown = sorted(map(str, config.keys() - set(keys)))
        if unknown:
            raise _speculative_error(
                f"speculative_config has unknown keys {unknown}; nanoengine takes {keys} "
                "(vLLM's names for the n-gram, draft-model and EAGLE methods).",
                value=config,
            )
        if "num_speculative_tokens" not in config:
            raise _speculative_error(
                'speculative_config needs "num_speculative_tokens", the number of draft '
                'tokens per step (e.g. {"method": "ngram", "num_speculative_tokens": 4}).',
                value=config,
            )
        return cls(**config)
