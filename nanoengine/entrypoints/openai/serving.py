"""From an OpenAI request to AsyncLLM.generate() calls, and from their deltas to OpenAI's responses and server-sent
event streams (vllm/entrypoints/openai/completion/serving.py and chat_completion/serving.py).

Every request is checked before anything is queued: the body by pydantic (protocol.py), the sampling values by
SamplingParams, the prompt by the LLM. A check that fails raises OpenAIServingError naming the request's own field
(max_completion_tokens, top_logprobs: not the SamplingParams name it maps to), which the server answers with
OpenAI's error JSON.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Coroutine, Sequence
from contextlib import AsyncExitStack, aclosing
from dataclasses import dataclass, field, replace
from http import HTTPStatus
from typing import Any

from pydantic import BaseModel

from nanoengine.engine.async_llm import AsyncLLM
from nanoengine.entrypoints.openai.protocol import (
    SAMPLING_FIELDS,
    UNSUPPORTED_FIELDS,
    ChatCompletionLogProb,
    ChatCompletionLogProbs,
    ChatCompletionLogProbsContent,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatCompletionResponseChoice,
    ChatCompletionResponseStreamChoice,
    ChatCompletionStreamResponse,
    ChatResponseMessage,
    CompletionLogProbs,
    CompletionRequest,
    CompletionResponse,
    CompletionResponseChoice,
    CompletionStreamResponse,
    DeltaMessage,
    ErrorInfo,
    ErrorResponse,
    UsageInfo,
    random_uuid,
)
from nanoengine.errors import InvalidArgumentError
from nanoengine.outputs import Logprob, PromptLogprobs, RequestOutput, SampleLogprobs
from nanoengine.sampling_params import SamplingParams


class OpenAIServingError(Exception):
    """A request the server refuses: answered with OpenAI's error JSON and this status; `param` names the field."""

    def __init__(
        self, message: str, *, param: str | None = None, status: HTTPStatus = HTTPStatus.BAD_REQUEST, type: str = ""
    ) -> None:
        super().__init__(message)
        self.param, self.status = param, status
        self.type = type or ("BadRequestError" if status == HTTPStatus.BAD_REQUEST else status.phrase.replace(" ", ""))

    def to_response(self) -> ErrorResponse:
        return ErrorResponse(error=ErrorInfo(message=str(self), type=self.type, param=self.param, code=self.status))


@dataclass(slots=True)
class _Choice:
    """What one choice has received so far."""

    text: list[str] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    logprobs: SampleLogprobs = field(default_factory=list)
    num_chars: int = 0
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    prompt_logprobs: PromptLogprobs | None = None


class OpenAIServing:
    """The two generating endpoints over one AsyncLLM. `served_model_name` is the only model it answers to."""

    def __init__(self, async_llm: AsyncLLM, served_model_name: str) -> None:
        self.async_llm, self.llm = async_llm, async_llm.llm
        self.served_model_name = served_model_name

    # ---- checks -------------------------------------------------------------------------------------
    def check_model(self, request: CompletionRequest | ChatCompletionRequest) -> None:
        if request.model is not None and request.model != self.served_model_name:
            raise OpenAIServingError(
                f"The model `{request.model}` does not exist. Valid aliases: {self.served_model_name}.",
                param="model",
                status=HTTPStatus.NOT_FOUND,
                type="NotFoundError",
            )

    def sampling_params(
        self, request: CompletionRequest | ChatCompletionRequest, prompt_len: int, renames: dict[str, str]
    ) -> SamplingParams:
        """The request's SamplingParams (SAMPLING_FIELDS' table), with max_tokens capped at what max_model_len leaves
        after the prompt (vLLM's get_max_tokens). renames: SamplingParams field -> the request's field, for errors."""
        fields = type(request).model_fields
        kwargs = {}
        for name in [*SAMPLING_FIELDS, *UNSUPPORTED_FIELDS]:
            if name not in fields:
                continue
            value, target = getattr(request, name), SAMPLING_FIELDS.get(name)
            if target is None and value is not None and value != fields[name].default:
                raise OpenAIServingError(f"{name} is not supported by nanoengine yet; leave it out.", param=name)
            if target is not None and value is not None:
                kwargs[target] = value
        room = self.llm.max_model_len - prompt_len
        requested = getattr(request, renames.get("max_tokens", "max_tokens"))
        kwargs["max_tokens"] = room if requested is None else min(requested, room)
        kwargs["logprobs"] = request.logprobs if isinstance(request, CompletionRequest) else request.top_logprobs or 0
        if request.stream and request.prompt_logprobs is not None:
            raise OpenAIServingError("prompt_logprobs are not available when stream=true.", param="prompt_logprobs")
        if isinstance(request, ChatCompletionRequest) and not request.logprobs:
            if request.top_logprobs:
                raise OpenAIServingError("top_logprobs needs logprobs set to true.", param="top_logprobs")
            kwargs["logprobs"] = None
        try:
            return SamplingParams(**kwargs)
        except InvalidArgumentError as exc:
            raise _refused(exc, renames, None) from None

    def _generate(
        self, request: CompletionRequest | ChatCompletionRequest, prompt: str | list[int], prompt_field: str
    ) -> tuple[AsyncIterator[RequestOutput], int]:
        """A checked generate() call for one prompt, and the prompt's length in tokens."""
        is_chat = isinstance(request, ChatCompletionRequest)
        renames = {"logprobs": "top_logprobs"} if is_chat else {}
        if is_chat and request.max_completion_tokens is not None:
            renames["max_tokens"] = "max_completion_tokens"
        try:
            ((_, tokens),) = (
                self.llm._prepare(prompt, None) if isinstance(prompt, str) else self.llm._prepare(None, [prompt])
            )
        except InvalidArgumentError as exc:
            raise _refused(exc, {}, prompt_field) from None
        params = self.sampling_params(request, len(tokens), renames)
        try:
            gen = self.async_llm.generate(tokens, params, cache_salt=request.cache_salt, priority=request.priority)
        except InvalidArgumentError as exc:
            raise _refused(exc, renames, prompt_field) from None
        return gen, len(tokens)

    # ---- /v1/completions --------------------------------------------------------------------------
    def create_completion(self, request: CompletionRequest) -> AsyncIterator[str] | PendingResponse:
        """Check the request and start it: an SSE stream of strings, or a PendingResponse that awaits the response."""
        self.check_model(request)
        prompts = _prompts(request.prompt)
        calls = [self._generate(request, p, "prompt") for p in prompts]
        gens, lengths = [g for g, _ in calls], [n for _, n in calls]
        n = request.n
        if request.stream:
            return self._completion_stream(request, gens, lengths, n)
        return PendingResponse(self._completion_full(request, gens, lengths, n), gens)

    async def _completion_full(
        self, request: CompletionRequest, gens: list[AsyncIterator[RequestOutput]], lengths: list[int], n: int
    ) -> CompletionResponse:
        choices = [_Choice() for _ in range(len(gens) * n)]
        async for i, out in merge_async_iterators(*gens):
            _collect(choices[i * n + out.outputs[0].index], out)
        return CompletionResponse(
            model=self.served_model_name,
            choices=[
                CompletionResponseChoice(
                    index=j,
                    text="".join(c.text),
                    logprobs=_completion_logprobs(c.logprobs, c.token_ids, 0) if request.logprobs is not None else None,
                    finish_reason=c.finish_reason,
                    stop_reason=c.stop_reason,
                    token_ids=c.token_ids if request.return_token_ids else None,
                    prompt_logprobs=c.prompt_logprobs,
                )
                for j, c in enumerate(choices)
            ],
            usage=_usage(lengths, choices),
        )

    async def _completion_stream(
        self, request: CompletionRequest, gens: list[AsyncIterator[RequestOutput]], lengths: list[int], n: int
    ) -> AsyncIterator[str]:
        response_id, model = f"cmpl-{random_uuid()}", self.served_model_name
        choices = [_Choice() for _ in range(len(gens) * n)]
        include_usage, continuous = _usage_options(request)
        try:
            async for i, out in merge_async_iterators(*gens):
                index = i * n + out.outputs[0].index
                choice, delta = choices[index], out.outputs[0]
                offset = choice.num_chars
                _collect(choice, out)
                chunk = CompletionStreamResponse(
                    id=response_id,
                    model=model,
                    choices=[
                        CompletionResponseChoice(
                            index=index,
                            text=delta.text,
                            logprobs=_completion_logprobs(delta.logprobs or [], delta.token_ids, offset)
                            if request.logprobs is not None
                            else None,
                            finish_reason=delta.finish_reason,
                            stop_reason=delta.stop_reason,
                            token_ids=delta.token_ids if request.return_token_ids else None,
                        )
                    ],
                    usage=_usage(lengths, choices) if continuous else None,
                )
                yield _sse(chunk)
            if include_usage:
                yield _sse(
                    CompletionStreamResponse(id=response_id, model=model, choices=[], usage=_usage(lengths, choices))
                )
        except Exception as exc:  # noqa: BLE001  (the headers are sent: the error goes in the stream, as in vLLM)
            yield _sse(_stream_error(exc))
        yield "data: [DONE]\n\n"

    # ---- /v1/chat/completions ---------------------------------------------------------------------
    def create_chat_completion(self, request: ChatCompletionRequest) -> AsyncIterator[str] | PendingResponse:
        self.check_model(request)
        messages = [{"role": m.role, "content": m.text()} for m in request.messages]
        try:
            prompt = self.llm.apply_chat_template(messages)
        except (InvalidArgumentError, ValueError) as exc:  # the template's raise_exception is a ValueError
            raise OpenAIServingError(str(exc), param="messages") from None
        gen, length = self._generate(request, prompt, "messages")
        if request.stream:
            return self._chat_stream(request, gen, length)
        return PendingResponse(self._chat_full(request, gen, length), [gen])

    async def _chat_full(
        self, request: ChatCompletionRequest, gen: AsyncIterator[RequestOutput], length: int
    ) -> ChatCompletionResponse:
        choices = [_Choice() for _ in range(request.n)]
        async for out in gen:
            _collect(choices[out.outputs[0].index], out)
        return ChatCompletionResponse(
            model=self.served_model_name,
            choices=[
                ChatCompletionResponseChoice(
                    index=j,
                    message=ChatResponseMessage(content="".join(c.text)),
                    logprobs=_chat_logprobs(c.logprobs, c.token_ids, request.top_logprobs or 0)
                    if request.logprobs
                    else None,
                    finish_reason=c.finish_reason,
                    stop_reason=c.stop_reason,
                    token_ids=c.token_ids if request.return_token_ids else None,
                )
                for j, c in enumerate(choices)
            ],
            usage=_usage([length], choices),
            prompt_logprobs=choices[0].prompt_logprobs,
        )

    async def _chat_stream(
        self, request: ChatCompletionRequest, gen: AsyncIterator[RequestOutput], length: int
    ) -> AsyncIterator[str]:
        response_id, model = f"chatcmpl-{random_uuid()}", self.served_model_name
        choices = [_Choice() for _ in range(request.n)]
        include_usage, continuous = _usage_options(request)

        def chunk(index: int, delta: DeltaMessage, **kwargs) -> str:
            usage = _usage([length], choices) if continuous else None
            choice = ChatCompletionResponseStreamChoice(index=index, delta=delta, **kwargs)
            return _sse(ChatCompletionStreamResponse(id=response_id, model=model, choices=[choice], usage=usage))

        try:
            # As vLLM and OpenAI: every choice first gets a chunk with the role alone.
            for index in range(request.n):
                yield chunk(index, DeltaMessage(role="assistant", content=""))
            async with aclosing(gen):
                async for out in gen:
                    delta = out.outputs[0]
                    _collect(choices[delta.index], out)
                    logprobs = (
                        _chat_logprobs(delta.logprobs or [], delta.token_ids, request.top_logprobs or 0)
                        if request.logprobs
                        else None
                    )
                    yield chunk(
                        delta.index,
                        DeltaMessage(content=delta.text),
                        logprobs=logprobs,
                        finish_reason=delta.finish_reason,
                        stop_reason=delta.stop_reason,
                        token_ids=delta.token_ids if request.return_token_ids else None,
                    )
            if include_usage:
                usage = _usage([length], choices)
                yield _sse(ChatCompletionStreamResponse(id=response_id, model=model, choices=[], usage=usage))
        except Exception as exc:  # noqa: BLE001  (the headers are sent: the error goes in the stream, as in vLLM)
            yield _sse(_stream_error(exc))
        yield "data: [DONE]\n\n"


@dataclass(slots=True)
class PendingResponse:
    """A non-streamed response under way, and the generators to close if its client goes away first."""

    response: Coroutine[Any, Any, BaseModel]
    gens: Sequence[AsyncIterator[RequestOutput]]

    async def close(self) -> None:
        for gen in self.gens:
            await gen.aclose()  # type: ignore[attr-defined]


async def merge_async_iterators(*iterators: AsyncIterator[RequestOutput]) -> AsyncIterator[tuple[int, RequestOutput]]:
    """Items of several async iterators as they come, each with its iterator's index (vllm/utils/async_utils.py's
    merge_async_iterators). Closing the merge, or an iterator's exception, closes every iterator."""
    if len(iterators) == 1:
        async with aclosing(iterators[0]) as it:
            async for item in it:
                yield 0, item
        return
    queue: asyncio.Queue[tuple[int, RequestOutput] | BaseException | None] = asyncio.Queue()

    async def drain(i: int, it: AsyncIterator[RequestOutput]) -> None:
        try:
            async for item in it:
                queue.put_nowait((i, item))
        except Exception as exc:  # noqa: BLE001  (handed to the consumer, which raises it)
            queue.put_nowait(exc)
        else:
            queue.put_nowait(None)

    async with AsyncExitStack() as stack:
        for it in iterators:
            stack.push_async_callback(it.aclose)  # type: ignore[attr-defined]
        tasks = [asyncio.create_task(drain(i, it)) for i, it in enumerate(iterators)]
        stack.callback(lambda: [t.cancel() for t in tasks])
        running = len(tasks)
        while running:
            item = await queue.get()
            if item is None:
                running -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield item


# ---- shaping ----------------------------------------------------------------------------------------
def _prompts(prompt: str | list) -> list[str | list[int]]:
    """The prompts of a completions request: a string, a list of strings, a list of ids or a list of such lists."""
    if isinstance(prompt, str) or (prompt and isinstance(prompt[0], int)):
        return [prompt]
    if not prompt:
        raise OpenAIServingError("prompt is empty; give a string, a list of strings or of token ids.", param="prompt")
    return list(prompt)


def _refused(exc: InvalidArgumentError, renames: dict[str, str], prompt_field: str | None) -> OpenAIServingError:
    """An engine's InvalidArgumentError as a 400 naming the request's field (a prompt's own errors name none)."""
    param = exc.parameter
    if param in (None, "prompts", "prompt_token_ids"):
        param = prompt_field
    elif param in renames:
        param = renames[param]
    message = str(exc)
    for ours, theirs in renames.items():
        message = message.replace(f"{ours}=", f"{theirs}=")
    return OpenAIServingError(message, param=param)


def _collect(choice: _Choice, out: RequestOutput) -> None:
    delta = out.outputs[0]
    choice.text.append(delta.text)
    choice.num_chars += len(delta.text)
    choice.token_ids += delta.token_ids
    choice.logprobs += delta.logprobs or []
    choice.finish_reason, choice.stop_reason = delta.finish_reason, delta.stop_reason
    if out.prompt_logprobs is not None:  # -inf is no JSON number: clamped as vLLM's clamp_prompt_logprobs does
        choice.prompt_logprobs = [
            None if entry is None else {t: replace(lp, logprob=max(lp.logprob, -9999.0)) for t, lp in entry.items()}
            for entry in out.prompt_logprobs
        ]


def _usage(prompt_lengths: list[int], choices: list[_Choice]) -> UsageInfo:
    prompt = sum(prompt_lengths)
    completion = sum(len(c.token_ids) for c in choices)
    return UsageInfo(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion)


def _usage_options(request: CompletionRequest | ChatCompletionRequest) -> tuple[bool, bool]:
    options = request.stream_options
    include = bool(options and options.include_usage)
    return include, include and bool(options and options.continuous_usage_stats)


def _sse(body: BaseModel) -> str:
    return f"data: {body.model_dump_json(exclude_unset=False)}\n\n"


def _stream_error(exc: Exception) -> ErrorResponse:
    if isinstance(exc, OpenAIServingError):
        return exc.to_response()
    status = HTTPStatus.INTERNAL_SERVER_ERROR
    return ErrorResponse(
        error=ErrorInfo(message=f"{type(exc).__name__}: {exc}", type="InternalServerError", code=status)
    )


def _token(entry: dict[int, Logprob], token_id: int) -> str:
    return entry[token_id].decoded_token or ""


def _completion_logprobs(logprobs: SampleLogprobs, token_ids: list[int], offset: int) -> CompletionLogProbs:
    """The legacy completions shape: per token its text, its logprob, the top tokens' logprobs by text (the sampled
    token's among them, as vLLM gives them) and where it starts in the text."""
    out = CompletionLogProbs()
    for entry, token_id in zip(logprobs, token_ids):
        text = _token(entry, token_id)
        out.tokens.append(text)
        out.token_logprobs.append(max(entry[token_id].logprob, -9999.0))
        out.top_logprobs.append({(lp.decoded_token or ""): max(lp.logprob, -9999.0) for lp in entry.values()})
        out.text_offset.append(offset)
        offset += len(text)
    return out


def _chat_logprobs(logprobs: SampleLogprobs, token_ids: list[int], top: int) -> ChatCompletionLogProbs:
    """The chat shape: per token its text, logprob and UTF-8 bytes, and the `top` most likely tokens by rank."""

    def one(lp: Logprob) -> ChatCompletionLogProb:
        text = lp.decoded_token or ""
        return ChatCompletionLogProb(token=text, logprob=max(lp.logprob, -9999.0), bytes=list(text.encode()))

    content = []
    for entry, token_id in zip(logprobs, token_ids):
        ranked = sorted((lp for lp in entry.values() if lp.rank is not None and lp.rank <= top), key=lambda lp: lp.rank)
        sampled = one(entry[token_id])
        content.append(ChatCompletionLogProbsContent(**sampled.model_dump(), top_logprobs=[one(lp) for lp in ranked]))
    return ChatCompletionLogProbs(content=content)
