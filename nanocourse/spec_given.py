"""Chapter 13's given verify step: the engine's greedy verdict, and each sampled request handed to a rule of yours.

Both exercises/ch13_spec_decode.py and its worked solution call it with their own rejection_random_sample
(task 13.3), so the split of the rows is written once.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from nanoengine.sample.rejection_sampler import rejection_sample as engine_rejection_sample
from nanoengine.sampling_params import SamplingParams

RandomSample = Callable[[torch.Tensor, list[int], SamplingParams, "torch.Generator | None"], list[int]]


def verify_rows(
    logits: torch.Tensor,
    draft_token_ids: list[list[int]],
    params: list[SamplingParams],
    generators: list[torch.Generator | None],
    random_sample: RandomSample,
) -> list[list[int]]:
    """len(drafts) + 1 rows per request, request after request: a greedy request gets the engine's verdict, a
    sampled one random_sample(its rows, its drafts, its params, its generator)."""
    out, start = [], 0
    for drafts, p, gen in zip(draft_token_ids, params, generators):
        rows = logits[start : start + len(drafts) + 1]
        start += len(drafts) + 1
        if p.greedy:
            out.extend(engine_rejection_sample(rows, [drafts], [p], [gen]))
        else:
            out.append(random_sample(rows, drafts, p, gen))
    return out
