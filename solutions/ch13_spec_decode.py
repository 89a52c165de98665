"""Chapter 13 solutions: speculative decoding: draft, verify, accept, roll back."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from nanocourse.builds_on import chapter_07_scheduler
from nanocourse.spec_design import K_MAX
from nanocourse.spec_given import verify_rows
from nanoengine.request import Request, RequestStatus
from nanoengine.sample.sampler import draw, target_probs
from nanoengine.sampling_params import SamplingParams
from nanoengine.spec_decode.ngram_proposer import NgramProposer as EngineNgramProposer


class NgramProposer(EngineNgramProposer):
    """Given: the engine's proposer and its rule, inherited."""


def rejection_sample(
    logits: torch.Tensor,
    draft_token_ids: list[list[int]],
    params: list[SamplingParams],
    generators: list[torch.Generator | None],
) -> list[list[int]]:
    """Given: len(drafts) + 1 rows per request, request after request; greedy requests get the engine's verdict,
    sampled ones rejection_random_sample's."""
    return verify_rows(logits, draft_token_ids, params, generators, rejection_random_sample)


def rejection_random_sample(
    rows: torch.Tensor, drafts: list[int], params: SamplingParams, gen: torch.Generator | None
) -> list[int]:
    """Task 13.3: accept draft d with probability p(d) (a one-hot draft distribution); at the first rejection
    draw from p without d; after all, the bonus token from the last row."""
    for i, draft in enumerate(drafts):
        probs = target_probs(rows[i], params)
        if float(torch.rand((), generator=gen)) < float(probs[draft]):
            continue
        probs[draft] = 0.0
        return drafts[:i] + [draw(probs, gen)]
    return list(drafts) + [draw(target_probs(rows[len(drafts)], params), gen)]


# The worked chapter 07 Scheduler (solutions/ch07_scheduler.py): grading the solutions grades the two chapters together.
Chapter07Scheduler = chapter_07_scheduler("solutions")


class Scheduler(Chapter07Scheduler):
    """Chapter 07's schedule() with chapter 13's two speculative methods."""

    def scheduled_spec_decode_tokens(self, num_scheduled: dict[str, int]) -> dict[str, list[int]]:
        """Task 13.4: the scheduled tokens past num_tokens are drafts; every scheduled request's drafts are used up."""
        verified = {}
        for req_id, num_new in num_scheduled.items():
            request = self.requests[req_id]
            if not request.spec_token_ids:
                continue
            num_spec = num_new + request.num_computed_tokens - request.num_tokens
            if num_spec > 0:
                verified[req_id] = request.spec_token_ids[:num_spec]
            request.spec_token_ids = []
        return verified

    def update_request_with_output(
        self, request: Request, new_token_ids: list[int], spec_token_ids: list[int]
    ) -> RequestStatus | None:
        """Task 13.5: roll back the rejected drafts, then append one token at a time and stop where a stop rule says."""
        if spec_token_ids:
            num_rejected = len(spec_token_ids) - (len(new_token_ids) - 1)
            request.num_computed_tokens -= num_rejected
        for num_new, token in enumerate(new_token_ids, 1):
            request.append_output_token_ids(token)
            status = self.check_stop(request)
            if status is not None:
                request.num_computed_tokens -= len(new_token_ids) - num_new
                return status
        return None


class DraftLengthDesign:
    """Task 13.7: grow k by one after a step that accepted every draft; after a rejection, propose as many as that
    step accepted (the run of right drafts it saw); at k = 0, probe with one draft every fourth step, since without
    drafts the record never changes and a request that turned repetitive would never be noticed. The last step
    decides, so the rule keeps no state."""

    def num_drafts(self, history: Sequence[tuple[int, int]]) -> int:
        if not history:
            return 2  # a request without a record: the best fixed k's neighbour, revised after one step
        proposed, accepted = history[-1]
        if proposed and accepted == proposed:
            return min(K_MAX, proposed + 1)
        if proposed:
            return accepted
        return 1 if len(history) % 4 == 0 else 0
