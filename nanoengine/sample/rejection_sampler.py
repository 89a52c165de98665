"""Verify draft tokens against the model's own distribution (vllm/v1/sample/rejection_sampler.py).

A verify step gives a request with k drafts k + 1 rows of logits: row i predicts the token after its i-th
input (the last verified token, then d1..dk). The output is the accepted drafts and one token more, so a
step emits 1 to k + 1 tokens, each distributed exactly as plain decoding would draw it (Leviathan et al.,
arXiv:2211.17192, the algorithm vLLM's RejectionSampler follows).
"""

from __future__ import annotations

import torch

from nanoengine.sample.sampler import draw, target_probs
from nanoengine.sampling_params import SamplingParams


def rejection_sample(
    logits: torch.Tensor,
    draft_token_ids: list[list[int]],
    params: list[SamplingParams],
    generators: list[torch.Generator | None],
) -> list[list[int]]:
    """logits: [sum(len(d) + 1 for d in draft_token_ids), V] fp32, request after request. Returns, per
    request, its accepted drafts then the recovered token (at the first rejection) or the bonus token (all
    accepted). A request without drafts gets one token, drawn exactly as sampler.sample draws it."""
    argmax = logits.argmax(dim=-1).tolist()
    out, start = [], 0
    for drafts, p, gen in zip(draft_token_ids, params, generators):
        end = start + len(drafts) + 1
        out.append(_greedy(drafts, argmax[start:end]) if p.greedy else _random(logits[start:end], drafts, p, gen))
        start = end
    return out


def _greedy(drafts: list[int], argmax: list[int]) -> list[int]:
    """Accept the longest prefix of drafts equal to the argmax, then the argmax where they part (or after)."""
    accepted = next((i for i, (d, t) in enumerate(zip(drafts, argmax)) if d != t), len(drafts))
    return argmax[: accepted + 1]


def _random(logits: torch.Tensor, drafts: list[int], params: SamplingParams, gen: torch.Generator | None) -> list[int]:
    """Rejection sampling against a one-hot draft distribution q, as n-gram drafts have (vLLM's
    NO_DRAFT_PROBS): draft d is accepted with probability min(1, p(d) / q(d)) = p(d), where p is the row's
    tempered, top-k/top-p-filtered distribution; on rejection the token is drawn from max(0, p - q)
    renormalized, which is p without d."""
    for i, draft in enumerate(drafts):
        probs = target_probs(logits[i], params)
        # u < p(d): a token of probability 0 is never accepted, even for u = 0. vLLM 0.33's default V2 sampler
        # accepts on p(d) > u too (rejection_sampler_utils.py); the V1 runner's on u <= p(d) (target / draft >=
        # uniform): the two differ only when u equals p(d) exactly.
        if float(torch.rand((), generator=gen)) < float(probs[draft]):
            continue
        probs[draft] = 0.0
        return drafts[:i] + [draw(probs, gen)]
    return drafts + [draw(target_probs(logits[-1], params), gen)]
