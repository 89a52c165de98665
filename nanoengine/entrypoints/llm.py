"""The user-facing engine: LLM(...).generate(prompts, SamplingParams(...)) (vllm/entrypoints/llm.py).

LLM is the offline entrypoint only: its keyword arguments become an EngineArgs, which builds the EngineConfig
the LLMEngine and its layers are built from (engine/arg_utils.py, engine/llm_engine.py, worker/worker.py).
"""

from __future__ import annotations

import dataclasses
import inspect
import numbers
import os
import reprlib
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from typing import TYPE_CHECKING, Self

import torch

from nanoengine.attention.paged import PagedKVCache
from nanoengine.config import LlamaConfig, SpeculativeConfig
from nanoengine.engine.arg_utils import EngineArgs
from nanoengine.engine.llm_engine import EngineStats, LLMEngine
from nanoengine.errors import InvalidRequestError, RequestAbortedError
from nanoengine.kv_cache_interface import KVCacheGroupSpec
from nanoengine.model import LlamaForCausalLM
from nanoengine.model.tokenizer import Tokenizer
from nanoengine.outputs import RequestMetrics, RequestOutput
from nanoengine.parts import attribute, given_parts
from nanoengine.sampling_params import SamplingParams
from nanoengine.validation import check_int, check_names, check_optional_str

if TYPE_CHECKING:
    from tqdm import tqdm


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


# vLLM 0.33's arguments of LLM.generate and LLM.chat that nanoengine does not take, and what to do instead.
_UNSUPPORTED_GENERATE = {
    "lora_request": "nanoengine serves no LoRA adapters.",
    "tokenization_kwargs": "pass prompt_token_ids= to tokenize the prompts yourself.",
    "mm_processor_kwargs": "nanoengine serves text-only models.",
}
_UNSUPPORTED_CHAT = {
    **_UNSUPPORTED_GENERATE,
    "chat_template": "the model's own template (from its GGUF) is always used; or format the prompt yourself and "
    "call generate().",
    "chat_template_content_format": "message contents are plain strings.",
    "add_generation_prompt": "the assistant's turn is always opened; format the prompt yourself for anything else.",
    "continue_final_message": "format the prompt yourself and call generate().",
    "tools": "nanoengine has no tool calling.",
    "chat_template_kwargs": "format the prompt yourself and call generate().",
}


def _keywords(method: Callable) -> tuple[str, ...]:
    """The named parameters of a method, to suggest the closest to a keyword it does not take."""
    return tuple(n for n, p in inspect.signature(method).parameters.items() if n != "self" and p.kind != p.VAR_KEYWORD)


def _progress_bar(use_tqdm) -> Callable[..., tqdm]:
    """What makes generate's progress bar: tqdm, shown or not, or the caller's own callable (vLLM's use_tqdm)."""
    from tqdm.auto import tqdm  # here, not at import: under Jupyter tqdm.auto brings in IPython's widgets

    if isinstance(use_tqdm, bool):
        return partial(tqdm, disable=not use_tqdm)
    if callable(use_tqdm):
        return use_tqdm
    raise InvalidRequestError(
        f"use_tqdm must be True, False or a callable that makes a progress bar, got {reprlib.repr(use_tqdm)}.",
        parameter="use_tqdm",
        value=use_tqdm,
    )


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

    The keyword arguments are EngineArgs' fields (engine/arg_utils.py), with their defaults. Each mechanism of
    the KV memory is a part that may be replaced: block_table_cls, attention_backend, hash_block_tokens,
    free_queue_cls, block_pool, full_attention_manager_cls, kv_cache_manager_cls, scheduler_cls,
    sliding_window_manager_cls, proposer_cls and rejection_sampler, each behind a Protocol (parts.py lists
    them and how each is built); left out, or None, the engine's own part serves.

    Every argument is checked first: an unknown name, a wrong type or a value out of range raises
    InvalidEngineArgumentError naming it, and so does a part that fails to build or lacks a member of its
    Protocol. `max_logprobs` (vLLM's name and default, 20; -1: no
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

    def __init__(self, model: str | os.PathLike | LlamaForCausalLM | None = None, **kwargs):
        self.engine = LLMEngine.from_engine_args(EngineArgs.from_kwargs(model, kwargs))
        self.unclaimed: dict[str, RequestOutput] = {}  # finished requests whose call has not collected them
        # The parts given in place of the engine's own, by their code, to name the one an exception came from.
        self._given = given_parts(
            self.engine.config.parts, {"block_pool": type(self.engine.kv_cache_manager.block_pool)}
        )

    # ---- what the engine was built with, read from its config ---------------------------------
    @property
    def config(self) -> LlamaConfig:
        """The model's shape."""
        return self.engine.config.model_config.hf_config

    @property
    def model(self) -> LlamaForCausalLM:
        return self.engine.runner.model

    @property
    def tokenizer(self) -> Tokenizer | None:
        return self.engine.tokenizer

    @property
    def kv_cache(self) -> PagedKVCache:
        return self.engine.runner.kv_cache

    @property
    def backend(self):
        return self.kv_cache.backend

    @property
    def device(self) -> torch.device:
        return self.engine.config.model_config.device

    @property
    def dtype(self) -> torch.dtype:
        return self.engine.config.model_config.dtype

    @property
    def block_size(self) -> int:
        return self.engine.config.cache_config.block_size

    @property
    def max_model_len(self) -> int:
        return self.engine.config.model_config.max_model_len

    @property
    def max_logprobs(self) -> int:
        return self.engine.config.model_config.max_logprobs

    @property
    def speculative_config(self) -> SpeculativeConfig | None:
        return self.engine.config.speculative_config

    @property
    def draft_model(self) -> LlamaForCausalLM | None:
        drafter = self.engine.runner.drafter
        return None if drafter is None else drafter.model

    @property
    def kv_cache_groups(self) -> tuple[KVCacheGroupSpec, ...]:
        return self.engine.config.kv_cache_groups

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
        use_tqdm: bool | Callable[..., tqdm] = False,
        cache_salt: str | None = None,
        priority: int = 0,
        **kwargs,
    ) -> list[RequestOutput]:
        """Complete every prompt together (continuous batching); outputs come back in input order (an empty
        list of prompts gives an empty list, as in vLLM).

        use_tqdm: show a progress bar of finished requests (vLLM's argument, whose default is True; here
        False, so that a call prints nothing unless asked), or a callable that makes the bar from
        tqdm's arguments, as vLLM accepts (functools.partial(tqdm, leave=False)).
        cache_salt isolates these requests' prefix-cache entries from everyone else's (a tenant id);
        priority matters only with scheduling_policy="priority" (lower runs first).
        Any other keyword raises InvalidRequestError naming it: vLLM's (lora_request, ...) with what nanoengine
        does instead, others with the closest name.
        """
        if kwargs:
            check_names(InvalidRequestError, "LLM.generate", kwargs, _keywords(LLM.generate), _UNSUPPORTED_GENERATE)
        batch = self._prepare(prompts, prompt_token_ids)
        params = self._params_per_prompt(sampling_params, len(batch))
        check_optional_str(InvalidRequestError, "cache_salt", cache_salt)
        priority = check_int(InvalidRequestError, "priority", priority)
        make_bar = _progress_bar(use_tqdm)

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
            with make_bar(total=sum(map(len, ids)), desc="Generating", unit="req") as bar:
                while call.pending:
                    bar.update(len(call.step()))
            return [merge_samples([call.done[i] for i in children]) for children in ids]

    def chat(
        self,
        messages: list[dict] | str,
        sampling_params: SamplingParams | None = None,
        *,
        use_tqdm: bool | Callable[..., tqdm] = False,
        **kwargs,
    ) -> RequestOutput:
        """One assistant reply to `messages` ([{"role", "content"}], or a single user string). use_tqdm and
        unknown keywords as in generate()."""
        if kwargs:
            check_names(InvalidRequestError, "LLM.chat", kwargs, _keywords(LLM.chat), _UNSUPPORTED_CHAT)
        return self.generate(self.apply_chat_template(messages), sampling_params, use_tqdm=use_tqdm)[0]

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
        culprit = attribute(exc, self._given)
        part = f" It came from {culprit[1]}, the part given as LLM({culprit[0]}=...)." if culprit else ""
        return (
            f"nanoengine: {what}{where}.{part} This call's {num_aborted} unfinished request(s) were aborted and "
            "their KV blocks freed; the engine is ready for the next call."
        )

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
            self._verify_token_ids(p)
        return params

    def _verify_token_ids(self, p: SamplingParams) -> None:
        """What vLLM's SamplingParams.verify checks against the model and the engine: the token ids of
        logit_bias and stop_token_ids are in the vocabulary, and neither min_p nor logit_bias is asked of an
        engine with speculative decoding (vLLM 0.33 refuses both there)."""
        vocab = self.config.vocab_size
        for name, ids in (("logit_bias", list(p.logit_bias or ())), ("stop_token_ids", p.stop_token_ids)):
            if bad := [t for t in ids if not 0 <= t < vocab]:
                raise InvalidRequestError(
                    f"{name} has token id(s) {reprlib.repr(bad)} outside the vocabulary: ids must be in [0, {vocab}).",
                    parameter=name,
                    value=bad,
                )
        if self.speculative_config is not None:
            # vLLM resets a greedy request's min_p to 0 before this check: greedy never reads it.
            for name, used in (("min_p", p.min_p > 0.0 and not p.greedy), ("logit_bias", bool(p.logit_bias))):
                if used:
                    raise InvalidRequestError(
                        f"{name} is not supported with speculative decoding (vLLM 0.33 refuses it too): leave it "
                        "out, or build the LLM without speculative_config.",
                        parameter=name,
                        value=getattr(p, name),
                    )

    def _prepare(self, prompts, prompt_token_ids) -> list[tuple[str | None, list[int]]]:
        if (prompts is None) == (prompt_token_ids is None):
            raise InvalidRequestError("Pass exactly one of prompts (text) or prompt_token_ids.")
        if prompts is not None:
            prompts = [prompts] if isinstance(prompts, str) else prompts
            if self.tokenizer is None and prompts != []:
                raise InvalidRequestError(
                    "This LLM was built from a model without a tokenizer; pass prompt_token_ids=."
                )
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
    LLM.unclaimed for their owner. However the call ends otherwise (an exception from any part, a
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
        unclaimed, running = self.llm.unclaimed, self.pending & self.engine.outputs.keys()
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

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        unfinished = sorted(self.pending)
        for req_id in unfinished:
            self.llm.unclaimed.pop(req_id, None)
        self.engine.abort_request([i for i in unfinished if i in self.engine.outputs])
        if exc is not None and not isinstance(exc, GeneratorExit):
            exc.add_note(self.llm._failure_note(exc, len(unfinished)))
