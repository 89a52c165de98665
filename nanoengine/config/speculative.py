"""Speculative decoding's settings (vllm/config/speculative.py)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from nanoengine.errors import InvalidEngineArgumentError
from nanoengine.validation import check_choice, check_int

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
        """Whether the drafter reads the target's hidden states (vLLM's use_eagle). For EAGLE-1, nanoengine's one
        such drafter, it also means a prefix hit drops its last block: the head's KV at a position depends on the
        next token (vLLM's needs_eagle_block_drop, False for DFlash and DSpark, which read hidden states too)."""
        return self.method == "eagle"

    @property
    def num_lookahead_tokens(self) -> int:
        """KV slots to reserve past the tokens the target is scheduled for (vLLM's VllmConfig property): a draft
        model or an EAGLE head writes its own KV for the drafts it feeds itself, k of them at most; n-gram drafts
        write none."""
        return 0 if self.method == "ngram" else self.num_speculative_tokens

    @property
    def max_num_new_slots_for_drafting(self) -> int:
        """Input slots each scheduled request reserves in the step's budget beyond its scheduled tokens (vLLM's
        property of this name): a draft model's first pass reads the step's verified tokens and the one sampled
        after them, one token more than the target was scheduled; n-gram drafts and EAGLE-1 (which drafts one token
        a pass) need none. vLLM's parallel drafters (P-EAGLE, PARD) need K - 1 and K; nanoengine has none."""
        return 1 if self.method == "draft_model" else 0

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
