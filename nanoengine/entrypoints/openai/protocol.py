"""The OpenAI API's request and response bodies, as pydantic models (vllm/entrypoints/openai/*/protocol.py, the
fields nanoengine serves).

As in vLLM, a field the models do not know is ignored (OpenAIBaseModel's extra="allow"), and a known one of the
wrong type is refused with a 400 naming it. A known field that nanoengine cannot serve yet is refused too, once set
to anything but its neutral value: SAMPLING_FIELDS maps each request field to its SamplingParams field, None where
there is none yet, so a field the engine learns is one line here.
"""

from __future__ import annotations

import time
import uuid
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from nanoengine.outputs import Logprob

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1

# Request field -> SamplingParams field (None: not supported by nanoengine yet; the request is refused when the field
# is set to anything but its default). max_tokens and logprobs differ between the two endpoints: serving.py maps them.
SAMPLING_FIELDS: dict[str, str | None] = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "seed": "seed",
    "stop": "stop",
    "n": "n",
    "ignore_eos": "ignore_eos",
    "prompt_logprobs": "prompt_logprobs",
    "min_p": "min_p",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
    "repetition_penalty": "repetition_penalty",
    "stop_token_ids": "stop_token_ids",
    "min_tokens": "min_tokens",
    "logit_bias": "logit_bias",
    "use_beam_search": None,
    "include_stop_str_in_output": None,
}
# Fields of the requests that are not sampling parameters and that nanoengine cannot serve yet (refused when set).
UNSUPPORTED_FIELDS = ("echo", "suffix", "response_format", "tools", "tool_choice")


def random_uuid() -> str:
    return uuid.uuid4().hex


class OpenAIBaseModel(BaseModel):
    # The OpenAI API allows fields a server does not know: vLLM ignores them, and so does nanoengine.
    model_config = ConfigDict(extra="allow")


class ErrorInfo(OpenAIBaseModel):
    message: str
    type: str
    param: str | None = None
    code: int


class ErrorResponse(OpenAIBaseModel):
    error: ErrorInfo


class StreamOptions(OpenAIBaseModel):
    include_usage: bool | None = False
    continuous_usage_stats: bool | None = False


class _SamplingRequest(OpenAIBaseModel):
    """The fields both endpoints share (vLLM's names, defaults and bounds)."""

    model: str | None = None
    n: int = 1
    seed: Annotated[int, Field(ge=_INT64_MIN, le=_INT64_MAX)] | None = None
    stop: str | list[str] | None = []
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    temperature: float | None = None
    top_p: float | None = None
    user: str | None = None
    top_k: int | None = None
    ignore_eos: bool = False
    prompt_logprobs: int | None = None
    cache_salt: str | None = None
    priority: int = 0
    return_token_ids: bool | None = None
    # Known, not served yet (SAMPLING_FIELDS, UNSUPPORTED_FIELDS): their defaults are the neutral values.
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    stop_token_ids: list[int] | None = []
    min_tokens: int = 0
    use_beam_search: bool = False
    include_stop_str_in_output: bool = False
    response_format: dict[str, Any] | None = None


class CompletionRequest(_SamplingRequest):
    prompt: list[Annotated[int, Field(ge=0)]] | list[list[Annotated[int, Field(ge=0)]]] | str | list[str]
    echo: bool | None = False
    logprobs: int | None = None
    max_tokens: int | None = 16
    suffix: str | None = None


class TextContentPart(OpenAIBaseModel):
    type: Literal["text"]
    text: str


class ChatMessage(OpenAIBaseModel):
    role: str
    content: str | list[TextContentPart] | None = None

    def text(self) -> str:
        """The content as one string (text parts joined, as vLLM does for a text-only model)."""
        if isinstance(self.content, list):
            return "\n".join(part.text for part in self.content)
        return self.content or ""


class ChatCompletionRequest(_SamplingRequest):
    messages: list[ChatMessage]
    logprobs: bool | None = False
    top_logprobs: int | None = 0
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = "none"


class UsageInfo(OpenAIBaseModel):
    prompt_tokens: int = 0
    total_tokens: int = 0
    completion_tokens: int | None = 0


class CompletionLogProbs(OpenAIBaseModel):
    text_offset: list[int] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    tokens: list[str] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)


class CompletionResponseChoice(OpenAIBaseModel):
    index: int
    text: str
    logprobs: CompletionLogProbs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    token_ids: list[int] | None = None
    prompt_token_ids: list[int] | None = None
    prompt_logprobs: list[dict[int, Logprob] | None] | None = None


class CompletionResponse(OpenAIBaseModel):
    id: str = Field(default_factory=lambda: f"cmpl-{random_uuid()}")
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionResponseChoice]
    usage: UsageInfo | None = None


class CompletionStreamResponse(CompletionResponse):
    pass


class ChatCompletionLogProb(OpenAIBaseModel):
    token: str
    logprob: float = -9999.0
    bytes: list[int] | None = None


class ChatCompletionLogProbsContent(ChatCompletionLogProb):
    top_logprobs: list[ChatCompletionLogProb] = Field(default_factory=list)


class ChatCompletionLogProbs(OpenAIBaseModel):
    content: list[ChatCompletionLogProbsContent] | None = None


class ChatResponseMessage(OpenAIBaseModel):
    role: str = "assistant"
    content: str | None = None


class DeltaMessage(OpenAIBaseModel):
    role: str | None = None
    content: str | None = None


class ChatCompletionResponseChoice(OpenAIBaseModel):
    index: int
    message: ChatResponseMessage
    logprobs: ChatCompletionLogProbs | None = None
    finish_reason: str | None = "stop"
    stop_reason: int | str | None = None
    token_ids: list[int] | None = None


class ChatCompletionResponse(OpenAIBaseModel):
    id: str = Field(default_factory=lambda: f"chatcmpl-{random_uuid()}")
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatCompletionResponseChoice]
    usage: UsageInfo
    prompt_logprobs: list[dict[int, Logprob] | None] | None = None


class ChatCompletionResponseStreamChoice(OpenAIBaseModel):
    index: int
    delta: DeltaMessage
    logprobs: ChatCompletionLogProbs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    token_ids: list[int] | None = None


class ChatCompletionStreamResponse(OpenAIBaseModel):
    id: str = Field(default_factory=lambda: f"chatcmpl-{random_uuid()}")
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatCompletionResponseStreamChoice]
    usage: UsageInfo | None = None


class ModelCard(OpenAIBaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=lambda: int(time.time()))
    owned_by: str = "nanoengine"
    max_model_len: int | None = None


class ModelList(OpenAIBaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard] = Field(default_factory=list)
