"""The user-facing engine: LLM(...).generate(prompts, SamplingParams(...))."""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Iterator, Sequence

import torch

from nanoengine.attention import ContiguousKVCache
from nanoengine.errors import InvalidRequestError
from nanoengine.model import LlamaForCausalLM
from nanoengine.model_loader import load_checkpoint
from nanoengine.outputs import RequestOutput
from nanoengine.sampler import make_generator, sample
from nanoengine.sampling_params import SamplingParams
from nanoengine.tokenizer import Tokenizer


def resolve_device(device: str | torch.device) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


class LLM:
    """Load a llama GGUF (the embedded SmolLM2-135M-Instruct by default) and generate text.

    On CPU the model runs in fp32; on CUDA in bf16.
    """

    def __init__(
        self,
        model: str | os.PathLike | None = None,
        *,
        device: str = "auto",
        dtype: torch.dtype | None = None,
        max_model_len: int | None = None,
        progress: bool = True,
    ):
        ckpt = load_checkpoint(model, progress=progress)
        self.config = ckpt.config
        self.model_path = ckpt.source
        self.tokenizer = Tokenizer(ckpt.folder)
        self.device = resolve_device(device)
        self.dtype = dtype or (torch.bfloat16 if self.device.type == "cuda" else torch.float32)
        self.model = LlamaForCausalLM.from_state_dict(self.config, ckpt.state_dict, self.device, self.dtype)
        self.max_model_len = max_model_len or self.config.max_position_embeddings
        self._ids = itertools.count()

    def generate(
        self,
        prompts: str | Sequence[str] | None = None,
        sampling_params: SamplingParams | None = None,
        *,
        prompt_token_ids: Sequence[int] | Sequence[Sequence[int]] | None = None,
    ) -> list[RequestOutput]:
        """Complete each prompt (text, or token ids via prompt_token_ids)."""
        params = sampling_params or SamplingParams()
        return [self._run(ids, text, params) for text, ids in self._prepare(prompts, prompt_token_ids)]

    def chat(self, messages: list[dict] | str, sampling_params: SamplingParams | None = None) -> RequestOutput:
        """One assistant reply to `messages` ([{"role", "content"}], or a single user string)."""
        if isinstance(messages, str):
            messages = [{"role": "user", "content": messages}]
        return self.generate(self.tokenizer.apply_chat_template(messages), sampling_params)[0]

    def stream(self, prompt: str, sampling_params: SamplingParams | None = None) -> Iterator[str]:
        """Yield the completion's text piece by piece as tokens are generated."""
        (text, ids), = self._prepare(prompt, None)
        emitted = ""
        for state in self._steps(ids, sampling_params or SamplingParams()):
            new = state.text[len(emitted):]
            emitted = state.text
            if new:
                yield new

    def _prepare(self, prompts, prompt_token_ids) -> list[tuple[str | None, list[int]]]:
        if (prompts is None) == (prompt_token_ids is None):
            raise InvalidRequestError("Pass exactly one of prompts (text) or prompt_token_ids.")
        if prompts is not None:
            prompts = [prompts] if isinstance(prompts, str) else list(prompts)
            if not all(isinstance(p, str) for p in prompts):
                raise InvalidRequestError("prompts must all be strings; pass token ids via prompt_token_ids=.")
            batch = [(p, self.tokenizer.encode(p)) for p in prompts]
        else:
            ids = list(prompt_token_ids)
            batch = [(None, [*x]) for x in (ids if ids and not isinstance(ids[0], int) else [ids])]
        for _, ids in batch:
            self._validate(ids)
        return batch

    def _validate(self, ids: list[int]) -> None:
        if not ids:
            raise InvalidRequestError("The prompt is empty; give at least one token of text.")
        if len(ids) >= self.max_model_len:
            raise InvalidRequestError(
                f"The prompt has {len(ids)} tokens but max_model_len is {self.max_model_len}; shorten it."
            )
        vocab = self.config.vocab_size
        if any(not isinstance(t, int) or not 0 <= t < vocab for t in ids):
            raise InvalidRequestError(f"Token ids must be integers in [0, {vocab}).")

    def _run(self, ids: list[int], text: str | None, params: SamplingParams) -> RequestOutput:
        arrival = time.perf_counter()
        first = None
        for state in self._steps(ids, params):
            first = first or time.perf_counter()
        return RequestOutput(
            request_id=str(next(self._ids)), prompt=text, prompt_token_ids=ids, text=state.text,
            token_ids=state.token_ids, finish_reason=state.finish_reason, num_cached_tokens=0,
            arrival_time=arrival, first_token_time=first, finish_time=time.perf_counter(),
        )

    @torch.inference_mode()
    def _steps(self, ids: list[int], params: SamplingParams) -> Iterator["_State"]:
        """Prefill the prompt into a contiguous cache, then decode one token per step."""
        max_new = min(params.max_tokens, self.max_model_len - len(ids))
        cache = ContiguousKVCache(self.config, len(ids) + max_new, self.device, self.dtype)
        gen = make_generator(params.seed)
        state = _State(self.tokenizer, params)
        step_ids = ids
        while state.finish_reason is None:
            input_ids = torch.tensor(step_ids, device=self.device)
            positions = torch.arange(cache.num_tokens, cache.num_tokens + len(step_ids), device=self.device)
            hidden = self.model(input_ids, positions, cache)
            cache.advance(len(step_ids))
            token = sample(self.model.compute_logits(hidden[-1:]), [params], [gen])[0]
            state.append(token, self.config.eos_token_id, max_new)
            step_ids = [token]
            yield state


class _State:
    """A request's output so far, and whether it is done."""

    def __init__(self, tokenizer: Tokenizer, params: SamplingParams):
        self.tokenizer, self.params = tokenizer, params
        self.token_ids: list[int] = []
        self.text = ""
        self.finish_reason: str | None = None

    def append(self, token: int, eos: int, max_new: int) -> None:
        p = self.params
        if token == eos and not p.ignore_eos:
            self.finish_reason = "stop"
        self.token_ids.append(token)
        self.text = self.tokenizer.decode(self.token_ids)
        for s in p.stop:
            if (cut := self.text.find(s)) >= 0:
                self.text, self.finish_reason = self.text[:cut], "stop"
        if self.finish_reason is None and len(self.token_ids) >= max_new:
            self.finish_reason = "length"
