"""Chapter 13 exercises: speculative decoding: draft, verify, accept, roll back.

Three parts, each mirroring vLLM 0.33 (read them once yours pass), and 13.6, which checks 13.4 and 13.5 in the
engine; then an open design that goes beyond it:
- the accept rule of a sampled verify step, task 13.3 (vllm/v1/sample/rejection_sampler.py);
- the scheduler's two speculative pieces (vllm/v1/core/sched/scheduler.py): which drafts a step verifies (13.4),
  and the rollback of the rejected ones after it (13.5);
- task 13.7, your own rule for how many drafts a request proposes each step, graded by what it measures
  (nanocourse/spec_design.py); vLLM 0.33 proposes a fixed number.
Given, stated by contract below and shown at work in the notebook: the n-gram proposer (NgramProposer, the
engine's) and the greedy verdict (rejection_sample, which hands sampled requests to your rejection_random_sample).
Your Scheduler here builds on chapter 07's: it extends your chapter 07 Scheduler (exercises/ch07_scheduler.py)
once chapter 07 passes its grade, and nanoengine's Scheduler until then, so this chapter can come first. Tasks
13.4 to 13.6 then grade your two methods with the schedule() it extends; the scorecard says which, under its
heading, and so does my_llm()'s table.
Once the tasks pass, my_llm(speculative_config={"method": "ngram", "num_speculative_tokens": 4}) serves with them:
LLM(proposer_cls=NgramProposer, rejection_sampler=rejection_sample, scheduler_cls=Scheduler), your Scheduler in
the place of chapter 07's (it already holds the schedule() it extends).

Work in this order: the chapter and the contract, your own design, the grade; only then vLLM 0.33's
function, named in each task, read beside yours. Where the two differ is the lesson (what vLLM adds, what
nanoengine leaves out); reading vLLM's first turns the task into copying.

Check your work with:   make grade CH=13
Stuck? In the notebook, `from nanocourse import hint; hint("13")` lists this chapter's hints.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from nanocourse.builds_on import chapter_07_scheduler
from nanocourse.spec_design import K_MAX  # noqa: F401, RUF100  (13.7: the most drafts a step may verify)
from nanocourse.spec_given import verify_rows
from nanoengine.request import Request, RequestStatus
from nanoengine.sample.sampler import draw, target_probs  # noqa: F401, RUF100  (13.3: a row's p, one draw)
from nanoengine.sampling_params import SamplingParams
from nanoengine.spec_decode.ngram_proposer import NgramProposer as EngineNgramProposer


class NgramProposer(EngineNgramProposer):
    """Given (nothing to write): the engine's n-gram proposer, inherited, and its rule, which the notebook's
    section 2 shows at work. Contract of propose(token_ids, k=None), the drafts for a request whose verified
    tokens are token_ids: the longest suffix token_ids[-n:], min_ngram <= n <= max_ngram, that also occurs at an
    earlier start with at least one token after it (an occurrence may overlap the suffix; the suffix itself is
    never one); of its occurrences the earliest; then the tokens that follow it, at most k (the configured
    num_speculative_tokens, or fewer when asked), none at position max_model_len or past it. No such n-gram, or no
    room: [] (the request takes a plain decode step).
    (vLLM 0.33: _find_longest_matched_ngram_and_propose_tokens in vllm/v1/spec_decode/ngram_proposer.py, the V1
    runner's proposer, with a KMP scan of the reversed tokens in numba; nanoengine's is
    find_longest_matched_ngram_and_propose_tokens in nanoengine/spec_decode/ngram_proposer.py.)
    """


def rejection_sample(
    logits: torch.Tensor,
    draft_token_ids: list[list[int]],
    params: list[SamplingParams],
    generators: list[torch.Generator | None],
) -> list[list[int]]:
    """Given (nothing to write): the tokens a verify step emits per request. Greedy requests get the engine's
    verdict; sampled ones yours, rejection_random_sample (task 13.3).

    Inputs: logits [sum(len(d) + 1 for d in draft_token_ids), V] fp32, rows laid out request after request: a
    request with drafts d1..dk owns k + 1 rows, row i predicting the token after its i-th input (row 0 after its
    last verified token, row i after d_i). A request without drafts owns one row. params[r] and generators[r]
    are request r's (a generator may be None: then torch's global one; the same generator may serve several
    requests). Drafts are token ids in [0, V): the runner strips placeholder drafts before it calls this.
    Returns one list per request: its accepted drafts (a prefix of its drafts), then one token more: 1 to k + 1
    tokens. Greedy requests (params[r].greedy) get exactly what len(output) plain greedy steps would emit: the
    drafts up to the first that differs from its row's argmax, then that row's argmax (all accepted: the last
    row's). (vLLM 0.33: rejection_greedy_sample_kernel in vllm/v1/sample/rejection_sampler.py; nanoengine's
    rejection_sample in nanoengine/sample/rejection_sampler.py.)
    Example: rows' argmax [3, 5, 6, 1] and drafts [3, 5, 6] give [3, 5, 6, 1]; drafts [3, 4, 6] give [3, 5].
    """
    return verify_rows(logits, draft_token_ids, params, generators, rejection_random_sample)


def rejection_random_sample(
    rows: torch.Tensor, drafts: list[int], params: SamplingParams, gen: torch.Generator | None
) -> list[int]:
    """Task 13.3: the tokens one sampled request emits from a verify step: its accepted drafts (a prefix of
    drafts), then one token more.

    rows: the request's own len(drafts) + 1 rows of logits [len(drafts) + 1, V] fp32, row i predicting the token
    after its i-th input (row 0 after its last verified token, row i after drafts[i - 1]); drafts are token ids
    in [0, V) (the runner strips placeholder drafts). rejection_sample, given above, calls this once per sampled
    request.
    Contract: the emitted tokens are distributed exactly as plain sampling from the target would draw them,
    position by position: the first emitted token follows row 0's p whatever the drafts are; given that the
    tokens before position i were the drafts d1..di, the token at i follows row i's p; and tokens are emitted only
    while the rows still describe the true context (so the output is accepted drafts then one token). p is a row's
    target distribution: tempered, then top-k/top-p filtered, as the sampler draws. An n-gram draft is one token
    chosen for sure, not drawn from a distribution (vLLM's NO_DRAFT_PROBS). The rule that meets the requirement is
    yours to derive: section 3 of the notebook sets up the question, and Leviathan et al. (arXiv:2211.17192)
    answer it for drafts drawn from any distribution, a paper to read after your derivation, not before.
    Invariants the grader also checks:
    - a draft's verdict is random afresh, not shared with or drawn from another draft's;
    - a draft of probability 0 under its row's p is never accepted;
    - every random number comes from gen (torch's global generator when it is None), so the same seeds give
      the same tokens whatever else draws meanwhile. In which order you draw is yours: the grader checks the
      distributions and this determinism, not a particular stream of draws. The generators live on the CPU (the
      runner makes them with torch.Generator(), whatever device logits is on), so a number drawn with one is a CPU
      tensor; draw() moves its weights to the CPU itself.
    (vLLM 0.33: the default V2 runner's RejectionSampler, vllm/v1/worker/gpu/spec_decode/rejection_sampler.py
    with its kernels in rejection_sampler_utils.py; the V1 runner's rejection_random_sample_kernel and
    sample_recovered_tokens in vllm/v1/sample/rejection_sampler.py. Read them once your rule is derived: they
    state it.)
    Helpers (nanoengine.sample.sampler): target_probs(logits_row, params) is a row's p, a fresh tensor;
    draw(probs, generator) draws one token id (an int) from unnormalized non-negative weights.
    Example: p = [0.5, 0.3, 0.2] on row 0 and draft [1], over many verify steps: the output's first token is
    0, 1 and 2 in the proportions p gives them, and only an output that starts with the draft has a second
    token. With top_k = 1 (p puts 1 on the argmax), drafts equal to the rows' argmax are always all accepted.
    """
    raise NotImplementedError


# Your chapter 07 Scheduler if chapter 07 is finished (no stub left, every graded task passing), else
# nanoengine's: decided afresh each time this file is loaded (make grade CH=13, my_llm()).
Chapter07Scheduler = chapter_07_scheduler("exercises")


class Scheduler(Chapter07Scheduler):
    """Chapter 07's scheduler with chapter 13's two speculative methods: schedule() and the rest are what it
    extends (yours from chapter 07 once that chapter passes, nanoengine's until then); you write these two."""

    def scheduled_spec_decode_tokens(self, num_scheduled: dict[str, int]) -> dict[str, list[int]]:
        """Task 13.4: the drafts each scheduled request verifies this step.

        make_output calls this once per step, before num_computed_tokens advances, with num_scheduled
        (request id -> tokens scheduled this step, cut by the budget and max_model_len). Which of a request's
        positions a step feeds, and which of them hold drafts, is what section 3 of the notebook draws.
        Contract, for each request of num_scheduled:
        - Its entry names exactly the drafts among the tokens this step feeds it, in order: what the rejection
          sampler will judge, and what update_request_with_output will be told was verified. A step that feeds
          it no draft gives it no entry; no entry is ever [].
        - A draft is judged at most once, by the step that fed it, and only against the context it was proposed
          from. Every step changes a scheduled request's context (the engine proposes anew from what the step
          leaves), so no draft the request holds now may still be held when its next step is scheduled. A
          request not in num_scheduled keeps its drafts.
        - Placeholder drafts (PLACEHOLDER_TOKEN_ID) are already in spec_token_ids when this runs, and are drafts
          like any other here. schedule() gives a request admitted with one token left beside running decodes k
          of them, so that every request of the step feeds 1 + k tokens (vLLM's uniform decode batch); the runner
          never accepts one, so such a request gets exactly one token from the step, as without drafts.
        What a subclass can use: self.requests (request id -> Request, every request the scheduler holds), and
        on a Request num_tokens (its verified tokens), num_computed_tokens and spec_token_ids.
        (vLLM 0.33: the "Speculative decode related" lines of Scheduler.schedule in vllm/v1/core/sched/scheduler.py,
        where num_output_placeholders is 0 here: nanoengine's async scheduling does not run with speculative
        decoding, since EngineArgs refuses the pair.)
        Example: a decoding request (num_computed_tokens = num_tokens - 1) holding drafts [5, 6, 7, 8, 9] and
        scheduled 1 token verifies nothing: no entry. A 10-token prompt at 4 computed tokens, scheduled 4: no entry.
        The same decoding request scheduled 4 tokens: draw its positions as section 3 does, and check your answer
        against the greedy step the notebook's view shows.
        """
        raise NotImplementedError

    def update_request_with_output(
        self, request: Request, new_token_ids: list[int], spec_token_ids: list[int]
    ) -> RequestStatus | None:
        """Task 13.5: a request's tokens and computed count after a step that may have verified drafts.

        update_from_output calls this for each request past its prompt, with new_token_ids (what rejection_sample
        emitted for it: its accepted drafts, then one token; one token after a plain decode step) and spec_token_ids
        (the drafts this step verified, what scheduled_spec_decode_tokens returned for it; [] for none). new_token_ids
        is never empty here. When it is called, num_computed_tokens already counts every scheduled token: the last
        verified token (or the prompt chunk that completed the prompt) and all the drafts, accepted or not.
        Contract, after the call:
        - The request's output holds exactly the tokens a non-speculative run would have appended by now:
          new_token_ids in order, up to and including the first one that triggers a stop rule (EOS unless
          ignore_eos, a stop token, max_tokens, max_model_len), and nothing after it. Its block hashes cover them.
        - num_computed_tokens counts the positions the next step need not compute: those whose KV in the cache
          is the KV of the request's own tokens, and never so many that the next step could not sample the token
          after the request's last one (a step samples only from the rows of tokens it feeds). Which slots the
          step filled with a guess rather than the request's own KV is what section 3 of the notebook shows. The
          scheduler caches the request's blocks up to num_computed_tokens right after this call (section 4), so
          while this count is right no block holding a rejected draft is ever cached.
        - Both rules hold whatever the call returns: a stopped request keeps a true count too (vLLM's does).
        - It returns the finished status the stop rule gave, or None when the request goes on; the caller
          finishes the request (sets its status and frees it), so this method does not.
        What a subclass can use: request.append_output_token_ids(token or tokens) adds output tokens and hashes the
        blocks they fill (appending by hand would leave the hashes behind); self.check_stop(request) gives the
        finished status the request's tokens so far give it, judged on its last token and its length, or None,
        and changes nothing.
        (vLLM 0.33: the num_rejected lines of Scheduler.update_from_output, then _update_request_with_output, in
        vllm/v1/core/sched/scheduler.py; vLLM trims new_token_ids in place and returns (tokens, stopped).)
        Example: prompt of 5, output [9], drafts [7, 8, 9], so num_computed_tokens 9 on entry. New [7, 6]: output
        [9, 7, 6], 7 computed, None. New [7, 8, 9, 4]: output [9, 7, 8, 9, 4], None, and a count your rules give.
        With EOS 0, drafts [5, 0, 5] and new [5, 0, 5, 4]: output [9, 5, 0], FINISHED_STOPPED, and again the count
        is the rules' (reveal("13") shows both once the chapter passes).
        """
        raise NotImplementedError


class DraftLengthDesign:
    """Task 13.7, an open design: how many drafts to propose for one request this step. One object per request,
    asked once before each of its steps; it may keep state between the calls."""

    def num_drafts(self, history: Sequence[tuple[int, int]]) -> int:
        """Task 13.7: the number of drafts k, 0 to K_MAX (nanocourse.spec_design.K_MAX, 8), to propose for this
        request this step; the rule is yours to design.

        vLLM 0.33 proposes a fixed num_speculative_tokens for every request at every step (its optional
        num_speculative_tokens_per_batch_size picks k from the batch size, never from a request's record). A fixed k
        verifies drafts for nothing where a request's drafts are rejected early, and leaves tokens unproposed where
        they keep being accepted. This task goes beyond vLLM 0.33: choose k from this request's own record.
        history: one (drafts proposed, drafts accepted) pair per earlier step of this request, oldest first ([] at
        its first step), where drafts proposed is your choice after the cut to the room left (below); a step that
        accepted a of its k drafts emitted a + 1 tokens.
        Cost model (nanocourse.spec_design): a step that verifies k drafts for the request costs 1 + 0.25 k units
        (COST_PER_DRAFT, a stated ratio: on a loaded server each extra token a verify pass feeds costs about a
        quarter of a decode step), whatever is accepted. The goal: the most tokens emitted per unit of cost.
        Graded by a measured outcome, not by equality with anyone, on the 200 seeded acceptance traces of
        nanocourse.spec_design.TRACES (per request, per position: whether a draft there would be accepted; stretches
        of repetitive text where drafts are mostly right alternate with stretches of new text where they mostly are
        not, and a quarter of the requests stay low throughout):
        - every choice is an int in 0..K_MAX (replay() raises ValueError otherwise; a choice past the request's end
          is cut to the room left);
        - the tokens per unit cost over TRACES exceed `nanocourse.spec_design.bar()`, 1.06 times the best fixed k's
          (the best of k = 0..8 proposed at every step, k = 1 there, about 1.14 tokens per unit).
        What the bar separates, measured: every fixed k (k = K_MAX always reaches about 0.6 of the best fixed
        k's value), and an estimate of the request's acceptance rate so far scaled to K_MAX, land at or below the
        best fixed k; designs that pass came out about 7 to 11% above it. Measure while you design:
        `from nanocourse.spec_design import measure, bar, replay, TRACES; measure(DraftLengthDesign), bar()`, and
        `replay(DraftLengthDesign, TRACES[0]).steps` shows your choices on one trace, with what each accepted.
        Read after passing: `reveal("13")` (from nanocourse), and ask what your rule gives up.
        Example: history [(2, 2), (3, 1)]: the request's first step verified 2 drafts and accepted both (3 tokens),
        its second verified 3 and accepted 1 (2 tokens); any k in 0..8 may be returned.
        """
        raise NotImplementedError
