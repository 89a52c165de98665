"""Chapter 07 exercises: the scheduler. You write vLLM v1's schedule(); once it passes, it runs the engine.

Work in this order: the chapter and the contract, your own design, the grade; only then vLLM 0.33's
function, named in each task, read beside yours. Where the two differ is the lesson (what vLLM adds, what
nanoengine leaves out); reading vLLM's first turns the task into copying.

Check your work with:   make grade CH=07
Stuck? In the notebook, `from nanocourse import hint; hint("07")` lists this chapter's hints, from a nudge to
close-to-code; open them one at a time with hint("07", n).

Your Scheduler subclasses the engine's, so the bookkeeping is there to reuse and you write the policy. What you
have (a reference: which of these a step uses, and when, is yours to decide):

| you have | what it guarantees |
|---|---|
| `self.config` | `max_num_batched_tokens` (the budget), `max_num_seqs`, `max_model_len`, ... |
| `lookahead(r, n, num_computed)` | r's lookahead slots past n new tokens starting at num_computed (default: r's own) |
| `long_prefill_threshold()` | this step's chunk cap: the threshold, or 0 while one request is alone (vLLM 0.33) |
| `self.running` | the running requests, in admission order (a list) |
| `self.waiting` | a RequestQueue: `peek_request()`, `bool(self.waiting)`; FCFS or priority order already |
| `self.kv_cache_manager` | chapter 06's `get_computed_blocks` and `allocate_slots`, with the contracts stated there |
| `get_computed_blocks(r)` | r's hit; counts a lookup in the prefix-cache stats unless given `record_stats=False` |
| `allocate_slots(r, n, ...)` | n slots past a hit (its tokens and blocks), plus `num_lookahead_tokens` |
| ... `full_sequence_must_fit` | True: checks r's whole sequence, hit included, against free blocks; False: the step's |
| `self.policy` | `SchedulingPolicy.FCFS` or `SchedulingPolicy.PRIORITY` |
| `request.status` | `RequestStatus.RUNNING`, `PREEMPTED` (after `preempt`), ... |
| `preempt(r)` | for r out of running (choose_victim took it): frees its blocks, drops its drafts, requeues it first |
| `admit(r, n)` | moves the queue's head r (slots allocated; n: its hit, in tokens) to running; counts its lookup |
| `finish_length_capped(r)` | ends r (FINISHED_LENGTH_CAPPED): out of self.running or the waiting queue, blocks freed |
| `padded_size(r, num_computed, threshold, ids)` | with drafts, the 1 + k tokens newcomer r is padded to (0: none) |
| ... its `ids` | the running requests the step planned, not the newcomers it admitted: their kind decides it |
| `make_output(num_scheduled, new_blocks, new_reqs, preempted)` | packages the step (preempted: the victim Requests) |

A request has `request_id`, `num_tokens`, `num_computed_tokens`, `spec_token_ids` (its drafts, chapter 13),
`num_tokens_with_spec` (num_tokens plus its drafts), `num_prompt_tokens`, `sampling_params.max_tokens` (the most
output tokens in all, those already sampled included), `priority` and `arrival_time`.

A newcomer's num_computed_tokens stays 0 until admit: its tokens start at its hit, so lookahead() and
padded_size() take its hit as num_computed. preempt(r) resets r to 0 computed tokens and keeps its tokens. A
request finish_length_capped(r) ends is neither planned nor a victim (in neither num_scheduled nor preempted), and
the next update_from_output reports it finished.

get_computed_blocks returns (the hit as a KVCacheBlocks, its length in tokens); allocate_slots returns the new
blocks as a KVCacheBlocks, or None. A `KVCacheBlocks` (vLLM's name) holds one list of blocks per KV cache group,
`.blocks[g]`; `get_block_ids()` gives one list of ids per group, a tuple (a one-group model's reads `([3, 4],)`).
Your scheduler passes these along without looking inside, so it serves a model with several groups too: chapter
12's windowed models.
"""

from __future__ import annotations

from nanoengine.core.sched.output import (  # noqa: F401  (schedule builds these, and pads with placeholders)
    PLACEHOLDER_TOKEN_ID,
    NewRequestData,
    SchedulerOutput,
)
from nanoengine.core.sched.request_queue import SchedulingPolicy  # noqa: F401  (choose_victim needs it)
from nanoengine.core.sched.scheduler import Scheduler as EngineScheduler
from nanoengine.request import Request, RequestStatus  # noqa: F401  (schedule reads a status)


def chunk_size(num_needed: int, budget: int, threshold: int = 0) -> int:
    """Task 07.1: the tokens a request that still needs num_needed tokens may take in this step.

    What must hold: a step never plans past its budget, and no request is given tokens it does not need. A
    threshold (above 0; 0 sets none) is the most of a step one request may take, so that one long prompt cannot
    take a whole step from the requests beside it. And no capacity is wasted: a step that could have given more
    leaves its pass emptier than it had to be. A spent budget (0; a step never passes less) grants 0.
    It mirrors how vLLM 0.33's Scheduler.schedule sizes each request's `num_new_tokens`, to read after passing.
    Example: chunk_size(150, 64) == 64 (the budget limits); chunk_size(150, 64, 24) == 24 (the
    threshold limits harder); chunk_size(5, 64, 16) == 5 (the need limits); chunk_size(30, 10, 16) == 10.
    """
    raise NotImplementedError


def chunk_plan(num_tokens: int, budget: int, threshold: int = 0) -> list[int]:
    """Task 07.1: the chunk sizes a prompt of num_tokens gets, one per step, until it is computed, when it has
    each step's whole budget and other requests wait (so the threshold applies).

    What must hold: the chunks add up to num_tokens exactly, and each is what the step it stands for grants
    the tokens still to compute then (task 07.1's chunk_size, the whole budget left). A budget that can never
    finish a prompt is refused: budget below 1 raises ValueError naming it, rather than planning for ever.
    Example: chunk_plan(150, 64) == [64, 64, 22]; chunk_plan(150, 64, 24) == [24] * 6 + [6];
    chunk_plan(100, 32, 50) == [32, 32, 32, 4] (a threshold above the budget never binds).
    """
    raise NotImplementedError


class Scheduler(EngineScheduler):
    """Your scheduler. LLM(scheduler_cls=Scheduler) runs it; my_llm() does once chapter 07 passes."""

    def schedule(self) -> SchedulerOutput:
        """Tasks 07.2, 07.2b, 07.3, 07.5, 07.6, 07.7, 07.8 and 07.9: plan one step as vLLM 0.33's
        Scheduler.schedule does (vllm/v1/core/sched/scheduler.py, to read once yours passes), with one rule of
        nanoengine's own (Alone below: vLLM 0.33 has none), and return it as make_output packages it.

        What the plan must satisfy (properties of the step's result), and the questions the chapter left to you.
        The answers are yours; where one differs from vLLM 0.33's, the grader names the decision and the property
        at stake, with your plan and the expected one on the smallest case it found; hint("07") then leads to
        vLLM's rule, and reveal("07") gives its reason once the chapter passes.
        - Budget: the planned tokens, plus the drafting slots below, sum to at most config.max_num_batched_tokens,
          and the total the step reports is exact. Each planned request's share keeps task 07.1's properties
          against what is left at its turn: its need, the budget the requests planned before it left, and the
          threshold in force when the step starts (which caps nobody while one request alone runs or waits); and
          it is at least 1 token. (Budget 10, no threshold, two requests needing 1 and 20 tokens: the one planned
          first takes all it needs up to 10, the other at most what that leaves.) A running request needs every
          token it has not computed, its drafts included (chapter 13 gives it some), but none at position
          config.max_model_len - 1 or past it (the token sampled there would have no position). A running request
          always has one such token left here: one that reaches max_model_len has finished (vLLM 0.33 passes over
          one with none, which only async scheduling or pipeline parallelism makes). A newcomer needs its tokens
          past its cache hit.
        - Turns (question): in one step, who gets the budget first, the running requests or the newcomers? The
          goal: the blocks the pool has given out do work, and no request starves. Among the running requests,
          self.running's order stands.
        - Memory, all or nothing: a request is planned only together with the KV cache manager's grant of
          slots for exactly its planned tokens (and its lookahead, below); nobody is planned on a refusal.
        - Room: when a running request's grant is refused, room is made by recompute (preempt), with as few
          victims as possible, taken in the order choose_victim() names them; the request itself may come up.
          The plan the step returns holds only requests that still run after it, with the budget it reports
          exact, and a victim never costs the requests behind it their turn, a request that preempted itself
          included.
        - Alone (question; nanoengine's own rule, vLLM 0.33 has none): a running request's grant is refused and
          nobody else is left in self.running to preempt. What becomes of it? (If your answer preempts it, taking it
          through choose_victim() or straight out of self.running comes to the same: alone, it is all that rule
          can name.) The goal: no request waits for ever for blocks that can never be freed,
          and none is ended that could still run (its lookahead slots count: a readmission asks for them again).
          A request has drafts here when num_tokens_with_spec > num_tokens, whether or not this step planned them.
          The scheduler never reads the pool's size: decide from what the refusal and a preemption tell you.
          A waiting request refused while nothing runs: what becomes of it, and of the ones behind it? There the
          goal is also that a request which can never fit holds up nobody behind it.
        - Admission after a preemption (question): budget and blocks may be left after a step made room for a
          running request. Does that step admit newcomers? The goal: no more preemptions than the load forces
          (each one is recompute). Ending a request (Alone) is not a preemption, whatever your answer.
        - Admission: the admitted newcomers come from the front of the waiting queue, in its order. A newcomer is
          admitted only when budget is left, fewer than config.max_num_seqs requests run, and the KV cache manager
          grants it its cache hit and slots for its first chunk. Nothing changes for a request that is not
          admitted (no reference, no block, no count).
        - The gate (question): a newcomer whose first chunk fits the free blocks but whose whole prompt does not.
          Admit it? The goal: a request admitted is not preempted later for want of the blocks its own prompt
          needs, with nothing reserved for it in the meantime (the pool as it is).
        - Head of the queue (question): when a newcomer is not admitted, does one behind it get a try? The goal:
          the queue's order is the policy's promise (FCFS: arrival; priority: rank), and nobody in it waits for
          ever. (The engine's own waiting loop also passes over a
          request whose last output is still in flight, async scheduling in chapter 08; yours never meets one.)
        - Lookahead: every grant, to a running request or a newcomer, also holds config.num_lookahead_tokens
          slots past the request's planned tokens (a draft model writes its own KV there, chapter 13), but none
          at position config.max_model_len or past it. With num_lookahead_tokens 0 nothing changes.
        - Drafting (chapter 13; with no drafter nothing changes): a draft model adds
          config.max_num_new_slots_for_drafting tokens of its own to the forward pass for each planned request,
          and they count in the Budget above. Question: when is a request not planned for want of them? (Whether
          the running pass then stops or skips that request gives the same plan: the budget only shrinks.) A
          newcomer that padded_size pads (chapter 13 says why) is planned its padded size exactly or nothing,
          and leaves the step looking like a request verifying drafts: its spec_token_ids hold PLACEHOLDER_TOKEN_ID
          for every planned token past its own, so that num_tokens_with_spec covers them all; when its padded
          size does not fit, the Head of the queue question decides the ones behind it.
        - Stats: each admitted request's prefix-cache lookup is counted exactly once, at its admission; the
          lookups of requests left waiting are not counted.
        - Output: num_scheduled maps each planned request id to its tokens, in the order the step planned
          them; new_blocks maps each planned running request's id to get_block_ids() of the KVCacheBlocks
          its grant returned this step: a tuple with one list of block ids per KV cache group, in the order
          given (([],) when a one-group request got no new block; vLLM's scheduler sends None then);
          new_reqs lists admit()'s results in admission order; preempted lists the victims in order.

        Examples (block size 4). Some show a situation and ask; the graded task gives the expected plan.
        Budget 8, a lone 20-token prompt: the steps plan 8, 8 and 4 tokens, then 1 (its first decode).
        Budget 10, a decoding (1 token) and b waiting with a 20-token prompt that fits: how much does b get this
        step, and in which order do a and b appear? (07.2)
        Preemption, FCFS: running [a, b], both decoding, no block free, a's next position starts a new block, and
        w waiting would fit once b's blocks are free: the step plans {a: 1}, preempted [b]; b is back at the
        waiting queue's head, holding no block. Is w admitted? (07.6)
        Priority, budget 3, 7 usable blocks: running [a (priority 1), b, c (priority 0)], a and b decoding,
        each into a new block, c with 2 prompt tokens left, one block free: the step plans {b: 1, c: 2},
        preempted [a]; afterwards running is [b, c], waiting is [a], and a holds no block.
        Alone: running [a] only, a decoding into a new block, no block free, no drafts, w waiting with a prompt
        that fits once a's blocks are free: what becomes of a, and of w? And with drafts for a? (07.5)
        Head of the queue: waiting [x, y] where x's whole prompt does not fit the free blocks and y's would:
        which of them does the step admit? (07.6)
        max_model_len 16: a running request with 13 computed tokens and 4 drafts is planned 2 tokens
        (positions 13 and 14).
        Task 07.8 runs your schedule() beside the engine's over random workloads, many with drafts for every
        running request each step, lookahead slots, or a max_model_len small enough to cut them, and compares
        every step's plan, drafts, blocks, queues and prefix-cache counts: the rules above and vLLM's answers to
        the questions, nothing else, decide them all; its message names the decision where yours first differs.
        Every plan is also checked as your schedule() returns it (each scheduled request live and running, at
        least 1 token and at most its need, a newcomer starting at its cache hit, the budget and max_num_seqs
        kept), so a broken rule is named there, not steps later.
        Stuck? hint("07") lists the hints.
        """
        raise NotImplementedError

    def choose_victim(self) -> Request:
        """Task 07.4: remove the request to preempt from self.running and return it.

        What must hold: the victim is the running request the policy's promise protects least, so that no request
        loses its blocks while one with a weaker claim keeps them.
        - FCFS promises first come, first served. A request preempted and readmitted queued again: its claim
          starts over at its latest admission.
        - PRIORITY promises rank: a larger priority value is a worse rank, and between equal priorities the later
          arrival is worse.
        Afterwards the victim is no longer in self.running and the others keep their order. It mirrors the
        "Preempt the lowest-priority request" lines of vLLM 0.33's Scheduler.schedule, to read after passing.
        Example (self.running is in admission order): running [a (arrived 1.0), b (2.0)], FCFS: b.
        Running [old (arrived 1.0), x (5.0), y (3.0, readmitted after x was admitted)]: FCFS takes y, priority
        (all priorities 0) takes x. Running [a (priority 0, arrived 2.0), b (priority 1, arrived 0.5)], priority:
        b; afterwards self.running is [a]. Running [a (priority 0, arrived 1.0), b (priority 0, arrived 1.0)],
        priority: a, the earlier in self.running of two equal in both.
        """
        raise NotImplementedError


class VictimDesign(EngineScheduler):
    """Task 07.10, an open design: the engine's scheduler (vLLM's step, tasks 07.2-07.6 already written) with
    your own victim choice. It plugs in where any scheduler does: `LLM(scheduler_cls=VictimDesign)`."""

    def choose_victim(self) -> Request:
        """Task 07.10: remove the request to preempt from self.running and return it; which one is yours to design.

        Contract: called under FCFS, with at least one request running. The victim leaves self.running, and the
        others keep their order (the admission order the step walks). Graded by properties and a measured
        outcome, not by equality with anyone, on the 43 tight-pool workloads of nanocourse.victims.WORKLOADS
        (three written by hand, 40 drawn at random: 4 to 7 requests, budget 16, threshold 4, blocks of 4). As in
        real traffic, some requests stop on EOS before their max_tokens (about two in five of the drawn ones, and
        r1 of "two late arrivals"), at a point the scheduler cannot know in advance: max_tokens bounds what a
        request will still generate, it does not forecast it. Graded:
        - every plan keeps the step's rules (budget, pool, a victim planned for nothing), and no block is left
          held at the end;
        - nobody starves: every request has finished by step 1.25 x the steps vLLM's rule takes for that whole
          workload; and on nanocourse.victims.STARVING, built to starve (a 40-token prompt among twelve 8-token
          ones), no request stays from arrival to finish more than 1.25 x the longest any stays under vLLM's rule;
        - the tokens computed a second time, summed over the 43, are fewer than `nanocourse.victims.bar()`,
          0.95 of what vLLM's rule (the newest admitted first) recomputes there.
        What the bar separates, measured: rules that weigh only what a victim has done or holds (the fewest
        computed tokens first, the fewest full blocks, the fewest tokens in the last partial block, the most
        blocks, the oldest admitted) recompute as much as vLLM's rule or more, 1.02 to 1.53 of it; designs
        that pass came out, for example, at 0.87 to 0.94 (nanocourse.victims' docstring names those measured:
        read it once yours passes), and a pass may land anywhere below the bar. The bar lies between, a few
        percent from either side: a thought-through rule can still land near it, so measure while you design:
        `from nanocourse.victims import measure; sum(r.recomputed for r in measure(VictimDesign))`, and
        `replay(VictimDesign, "a long prompt among short ones").longest_stay()` for STARVING. A request's blocks
        hold self.kv_cache_manager.block_size tokens each.
        Read after passing: `reveal("07")` (from nanocourse), and ask what your rule gives up.
        Example: running [a (40 computed), b (8 computed), c (20 computed)]: any one may be returned, and
        self.running then holds the other two in this order.
        """
        raise NotImplementedError
