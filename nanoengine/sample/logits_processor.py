"""What a request's logit_bias, min_tokens and penalties do to its rows of logits before the sampler reads them.

vLLM 0.33 applies them in this order in both of its samplers: the V1 Sampler's non-argmax-invariant logits
processors (vllm/v1/sample/logits_processor/builtin.py: LogitBiasLogitsProcessor, MinTokensLogitsProcessor), then
apply_penalties (vllm/model_executor/layers/utils.py); the V2 runner's LogitBiasState then PenaltiesState
(vllm/v1/worker/gpu/sample/). Temperature, min_p, top-k and top-p come after, in the sampler (sampler.py). All three
here can change the argmax, so they apply to greedy rows too.

Rows whose request uses none of them cost nothing: the caller passes None for them, and a batch of such rows
returns its logits untouched, with no tensor built.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch.nn.utils.rnn import pad_sequence

from nanoengine.sampling_params import SamplingParams


@dataclass(frozen=True, slots=True)
class RowTokens:
    """What one row of logits needs beyond its parameters: the tokens before the one it predicts.

    output_token_ids: the request's generated tokens, then on a verify row the drafts before it (vLLM's
    _combine_outputs_with_spec_tokens), so each row is processed as plain decoding would process it.
    eos_token_id: the request's EOS, which min_tokens suppresses along with stop_token_ids (vLLM adds it to
    all_stop_token_ids whether or not ignore_eos is set).
    """

    params: SamplingParams
    prompt_token_ids: Sequence[int]
    output_token_ids: Sequence[int]
    eos_token_id: int | None

    @property
    def min_tokens_pending(self) -> bool:
        return len(self.output_token_ids) < self.params.min_tokens


def uses_logits_processors(params: SamplingParams, num_output_tokens: int) -> bool:
    """Whether a request with num_output_tokens generated so far needs its rows processed at all (a verify row
    counts its drafts too, but a draft only adds to num_output_tokens, which can only turn min_tokens off)."""
    return bool(params.logit_bias) or params.has_penalties or num_output_tokens < params.min_tokens


def apply_logits_processors(logits: torch.Tensor, rows: Sequence[RowTokens | None]) -> torch.Tensor:
    """logits [R, V] fp32, one entry of rows per row (None: nothing to do). Returns logits itself if no row has
    anything to do, else a processed copy: the caller's logits stay raw, as vLLM's default logprobs read them.

    In order: logit_bias adds its biases; min_tokens sets EOS and stop_token_ids to -inf while fewer than
    min_tokens tokens precede the row; then the penalties (repetition over prompt and output tokens, frequency
    and presence over output tokens only)."""
    active = [(i, row) for i, row in enumerate(rows) if row is not None]
    if not active:
        return logits
    logits = logits.clone()
    device = logits.device
    biased = [(i, token, bias) for i, row in active for token, bias in (row.params.logit_bias or {}).items()]
    if biased:
        rows_at, tokens_at, biases = zip(*biased)
        at = (torch.tensor(rows_at, device=device), torch.tensor(tokens_at, device=device))
        logits.index_put_(at, torch.tensor(biases, dtype=logits.dtype, device=device), accumulate=True)
    banned = [(i, token) for i, row in active if row.min_tokens_pending for token in _stop_token_ids(row)]
    if banned:
        rows_at, tokens_at = zip(*banned)
        logits[torch.tensor(rows_at, device=device), torch.tensor(tokens_at, device=device)] = float("-inf")
    penalized = [(i, row) for i, row in active if row.params.has_penalties]
    if penalized:
        index = torch.tensor([i for i, _ in penalized], device=device)
        logits[index] = apply_penalties(logits[index], [row for _, row in penalized])
    return logits


def _stop_token_ids(row: RowTokens) -> list[int]:
    eos = [] if row.eos_token_id is None else [row.eos_token_id]
    return [*row.params.stop_token_ids, *eos]


def apply_penalties(logits: torch.Tensor, rows: Sequence[RowTokens]) -> torch.Tensor:
    """vLLM's apply_penalties on logits [R, V], in place and returned: a token seen in the row's prompt or output
    has its logit divided by repetition_penalty when positive and multiplied by it otherwise; then every output
    token's logit loses frequency_penalty times its count and presence_penalty once."""
    vocab_size, device = logits.shape[1], logits.device
    output_counts = _bin_counts([row.output_token_ids for row in rows], vocab_size, logits.dtype, device)
    output_mask = output_counts > 0
    seen = output_mask | (_bin_counts([row.prompt_token_ids for row in rows], vocab_size, logits.dtype, device) > 0)

    def per_row(name: str) -> torch.Tensor:
        return torch.tensor([getattr(row.params, name) for row in rows], dtype=logits.dtype, device=device)[:, None]

    penalties = torch.where(seen, per_row("repetition_penalty"), 1.0)
    logits *= torch.where(logits > 0, 1.0 / penalties, penalties)
    logits -= per_row("frequency_penalty") * output_counts
    logits -= per_row("presence_penalty") * output_mask
    return logits


def _bin_counts(
    token_lists: Sequence[Sequence[int]], vocab_size: int, dtype: torch.dtype, device: torch.device
) -> torch.Tensor:
    """[R, V] counts of each token in each list, in dtype (they only ever scale a penalty). The lists are padded
    with token 0 at weight 0, so the counts come out contiguous (vLLM pads with vocab_size, to a column it then
    cuts off, which leaves a strided view that every later operation pays for)."""
    tokens = pad_sequence([torch.as_tensor(t, dtype=torch.int64) for t in token_lists], batch_first=True)
    weights = pad_sequence([torch.ones(len(t), dtype=dtype) for t in token_lists], batch_first=True)
    counts = torch.zeros(len(token_lists), vocab_size, dtype=dtype, device=device)
    return counts.scatter_add_(1, tokens.to(device), weights.to(device))
