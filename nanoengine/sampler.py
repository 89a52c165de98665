"""Turn a batch of logits into next tokens, one SamplingParams per row."""

from __future__ import annotations

import torch

from nanoengine.sampling_params import SamplingParams


def sample(logits: torch.Tensor, params: list[SamplingParams], generators: list[torch.Generator | None]) -> list[int]:
    """logits: [B, V] fp32. Greedy rows take the argmax; the others are tempered, truncated by
    top-k then top-p, and drawn from their own generator so a seeded request gives the same text
    whatever else shares its batch."""
    out = logits.argmax(dim=-1).tolist()
    for row, (p, gen) in enumerate(zip(params, generators)):
        if p.greedy:
            continue
        probs = _filtered_probs(logits[row] / p.temperature, p.top_k, p.top_p)
        out[row] = int(torch.multinomial(probs.cpu(), 1, generator=gen))
    return out


def _filtered_probs(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    sorted_logits, order = logits.sort(descending=True)
    if top_k > 0:
        sorted_logits[top_k:] = float("-inf")
    if top_p < 1.0:
        probs = sorted_logits.softmax(-1)
        # Drop a token once the mass before it already reaches top_p; the first token always stays.
        sorted_logits[(probs.cumsum(-1) - probs) >= top_p] = float("-inf")
    return torch.empty_like(logits).scatter_(0, order, sorted_logits).softmax(-1)


def make_generator(seed: int | None) -> torch.Generator | None:
    return torch.Generator().manual_seed(seed) if seed is not None else None
