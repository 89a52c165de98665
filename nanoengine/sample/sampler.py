"""Turn a batch of logits into next tokens, one SamplingParams per row."""

from __future__ import annotations

import torch

from nanoengine.outputs import Logprob
from nanoengine.sampling_params import SamplingParams


def sample(logits: torch.Tensor, params: list[SamplingParams], generators: list[torch.Generator | None]) -> list[int]:
    """logits: [B, V] fp32, already through logit_bias, min_tokens and the penalties (logits_processor.py).
    Greedy rows take the argmax; the others are tempered, truncated by min_p, top-k then top-p, and drawn from
    their own generator so a seeded request gives the same text whatever else shares its batch."""
    out = logits.argmax(dim=-1).tolist()
    for row, (p, gen) in enumerate(zip(params, generators)):
        if not p.greedy:
            out[row] = draw(target_probs(logits[row], p), gen)
    return out


def target_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The distribution a sampled row draws from: logits [V] tempered, then truncated by min_p, top-k and top-p
    (vLLM's order: min_p is its argmax-invariant logits processor, run after temperature and before top-k/top-p)."""
    # A penalty or temperature near 0 can push logits to +inf, where softmax gives NaN: the largest finite value
    # keeps the limit (a uniform draw among the tokens that grew without bound).
    logits = (logits / params.temperature).clamp(max=torch.finfo(logits.dtype).max)
    if params.min_p > 0.0:
        # vLLM's MinPLogitsProcessor: drop the tokens less likely than min_p times the likeliest one.
        probs = logits.softmax(-1)
        logits.masked_fill_(probs < probs.max() * params.min_p, float("-inf"))
    return _filtered_probs(logits, params.top_k, params.top_p)


def draw(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    """One token from probs [V] (not necessarily normalized), with the request's generator."""
    return int(torch.multinomial(probs.cpu(), 1, generator=generator))


def _filtered_probs(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    sorted_logits, order = logits.sort(descending=True)
    if top_k > 0:
        sorted_logits[top_k:] = float("-inf")
    if top_p < 1.0:
        probs = sorted_logits.softmax(-1)
        # Drop a token once the mass before it already reaches top_p; the first token always stays, even
        # for a top_p below float32's smallest number, which compares as 0.
        drop = (probs.cumsum(-1) - probs) >= top_p
        drop[0] = False
        sorted_logits[drop] = float("-inf")
    return torch.empty_like(logits).scatter_(0, order, sorted_logits).softmax(-1)


def compute_logprobs(logits: torch.Tensor, token_ids: list[int], num_logprobs: list[int]) -> list[dict[int, Logprob]]:
    """Per row of logits [R, V]: {token: Logprob} for the row's token first, then its num_logprobs most
    likely tokens (-1: all). They are vLLM's default raw logprobs, the log-softmax of the logits before
    temperature, top-k or top-p; a rank counts the tokens at least as likely (1 = the likeliest)."""
    logprobs = logits.float().log_softmax(-1)
    chosen = logprobs.gather(1, torch.tensor(token_ids, device=logits.device)[:, None])
    ranks = (logprobs >= chosen).sum(-1).tolist()
    k = max(logprobs.shape[1] if n == -1 else n for n in num_logprobs)
    top_values, top_ids = (t.tolist() for t in logprobs.topk(k, dim=-1)) if k else ([[]] * len(token_ids),) * 2
    out = []
    for row, (token, n) in enumerate(zip(token_ids, num_logprobs)):
        entry = {token: Logprob(chosen[row, 0].item(), ranks[row])}
        for rank, (tid, value) in enumerate(zip(top_ids[row][: k if n == -1 else n], top_values[row]), 1):
            entry.setdefault(tid, Logprob(value, rank))
        out.append(entry)
    return out


def make_generator(seed: int | None) -> torch.Generator | None:
    return torch.Generator().manual_seed(seed) if seed is not None else None
