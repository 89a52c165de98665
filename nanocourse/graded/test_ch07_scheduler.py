"""Chapter 07 graded tasks: the scheduler. Run with `make grade CH=07`.

Each task drives your Scheduler through real steps on a real KVCacheManager, in a situation small
enough to work out by hand; the expected plans below are those hand-worked ones (block size 4).
The last task runs the whole engine on your scheduler with a pool small enough to force preemption.
"""

from functools import partial

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from nanocourse.differential import (
    capped_workloads,
    per_group,
    replay_workload,
    scheduler_config,
    scheduler_workloads,
    within,
)
from nanocourse.plan_rules import checked_schedule
from nanocourse.policies import longest_common_prefix
from nanocourse.victims import BAR_FRACTION, MAX_STEPS, STARVING, FewestComputedFirst, bar, measure, replay
from nanoengine.core import KVCacheManager
from nanoengine.core.sched.scheduler import Scheduler, SchedulerConfig
from nanoengine.request import Request
from nanoengine.sampling_params import SamplingParams
from nanoengine.worker.outputs import ModelRunnerOutput

CHAPTER = "ch07_scheduler"
BS = 4
# Where a failure that names a decision sends the learner for vLLM's answer: its first message states the property
# the plan broke, the plan and the expected one, not vLLM's rule.
WHERE = 'hint("07") leads to vLLM 0.33\'s rule, and reveal("07") gives it with its reason once the chapter passes'


def _engine_chunk_size(num_needed, budget, threshold=0):
    return Scheduler.chunk_size(num_needed, budget, threshold)


def _engine_chunk_plan(num_tokens, budget, threshold=0):
    """The engine's chunks of one prompt while another request waits (max_num_seqs=1 keeps it waiting): alone,
    a prompt takes no threshold (nobody to starve), and chunk_plan is the busy case."""
    s = Scheduler(
        SchedulerConfig(max_num_batched_tokens=budget, max_num_seqs=1, long_prefill_token_threshold=threshold),
        KVCacheManager(BS, num_tokens // BS + 2, enable_caching=False),
    )
    s.add_request(req("prompt", num_tokens))
    s.add_request(req("waiting", 1))
    chunks = []
    while s.requests["prompt"].num_computed_tokens < num_tokens:
        chunks.append(s.schedule().num_scheduled_tokens["prompt"])
    return chunks


class _ClaimPerComputedToken(Scheduler):
    """Task 07.10 in "nanoengine" mode, where the engine keeps vLLM's rule: a design that passes, the running
    request with the most tokens still to claim (prompt and output) per token it has computed, plus one: it frees
    the most future room for the least work lost. The earliest admitted wins a tie."""

    def choose_victim(self):
        def still_to_claim(r):
            return r.num_prompt_tokens + r.sampling_params.max_tokens - r.num_tokens

        victim = max(self.running, key=lambda r: still_to_claim(r) / (1 + r.num_computed_tokens))
        self.running.remove(victim)
        return victim


NANOENGINE = {
    "chunk_size": _engine_chunk_size,
    "chunk_plan": _engine_chunk_plan,
    "Scheduler": Scheduler,
    "VictimDesign": _ClaimPerComputedToken,
}


def req(rid, n, priority=0, arrival=0.0, first=0):
    return Request(
        rid,
        list(range(first, first + n)),
        priority=priority,
        arrival_time=arrival,
        sampling_params=SamplingParams(max_tokens=64, ignore_eos=True),
    )


def make(impl, num_blocks=64, budget=64, policy="fcfs", caching=False, **cfg):
    return impl.Scheduler(
        SchedulerConfig(max_num_batched_tokens=budget, policy=policy, **cfg), KVCacheManager(BS, num_blocks, caching)
    )


def step(s):
    """One engine step without a model: schedule, then sample token 1 for every request whose
    prompt (or decode) is complete. Returns the SchedulerOutput, checked as schedule() hands it over."""
    so = checked_schedule(s)
    done = {r: [1] for r in so.num_scheduled_tokens if s.requests[r].num_computed_tokens == s.requests[r].num_tokens}
    s.update_from_output(so, ModelRunnerOutput(done))
    return so


def plan(s):
    so = step(s)
    return list(so.num_scheduled_tokens.items()), sorted(so.preempted_req_ids)


def _per_group(new_block_ids: list) -> list:
    """Each entry per KV cache group (nanocourse.differential.per_group): a bare list of ids shows as a difference."""
    return [per_group(ids) for ids in new_block_ids]


def _first_difference(yours: str, engine: str) -> str:
    """The first step line where two timelines part (for a failure message), spaces squeezed."""
    a, b = yours.splitlines(), engine.splitlines()
    k = longest_common_prefix(a, b)
    line = lambda lines: " ".join(lines[k].split())[:110] if k < len(lines) else "(no such step: the run ended)"
    return f"yours has {line(a)!r} where the engine has {line(b)!r}"


def _broken_grant(num_needed: int, budget: int, threshold: int, got) -> str | None:
    """The property of task 07.1's contract that chunk_size's `got` breaks for these arguments, in words; None if
    it keeps them all."""
    limits = {"what the request still needs": num_needed, "the budget left": budget}
    if threshold > 0:
        limits["the threshold"] = threshold
    if not isinstance(got, int) or got < 0:
        return "a grant is a count of tokens, an int of at least 0"
    for name, limit in limits.items():
        if got > limit:
            return f"it exceeds {name}, {limit}"
    if got < min(limits.values()):
        return (
            f"it holds back tokens: the need, the budget and the threshold (0 sets none) all allow "
            f"{min(limits.values())}, and a grant smaller than every limit leaves the pass emptier than it had to be"
        )
    return None


def _broken_plan(num_tokens: int, budget: int, threshold: int, got) -> str | None:
    """The property of task 07.1's chunk_plan contract that `got` breaks, in words; None if it keeps them all."""
    if not isinstance(got, list) or sum(got) != num_tokens:
        return f"the chunks must add up to the prompt's {num_tokens} tokens"
    left = num_tokens
    for k, chunk in enumerate(got):
        allowed = min(left, budget, threshold or left)
        if chunk != allowed:
            return (
                f"chunk {k} (step {k}) is {chunk}, but that step grants the {left} tokens still to compute {allowed} "
                f"(the need, the budget {budget} and the threshold {threshold}, 0 setting none, all allow that much)"
            )
        left -= chunk
    return None


@pytest.mark.task("07.1", "chunk_size and chunk_plan: no chunk exceeds any cap, and the chunks cover the prompt")
def test_chunks(impl):
    # Every small case, the smallest first (by the sum of the arguments), so a broken property is named on the
    # smallest input that breaks it.
    cases = sorted(((n, b, t) for n in range(1, 9) for b in range(9) for t in range(9)), key=sum)
    for num_needed, budget, threshold in cases:
        got = impl.chunk_size(num_needed, budget, threshold)
        broken = _broken_grant(num_needed, budget, threshold, got)
        assert broken is None, f"chunk_size({num_needed}, {budget}, {threshold}) returned {got!r}: {broken}"
    for num_needed, budget, threshold in ((150, 64, 0), (150, 64, 24), (5, 64, 16), (30, 10, 16)):
        got = impl.chunk_size(num_needed, budget, threshold)
        broken = _broken_grant(num_needed, budget, threshold, got)
        assert broken is None, f"chunk_size({num_needed}, {budget}, {threshold}) returned {got!r}: {broken}"
    for num_tokens, budget, threshold in sorted(
        ((n, b, t) for n in range(1, 13) for b in range(1, 6) for t in range(6)), key=sum
    ):
        got = within(2.0, partial(impl.chunk_plan, num_tokens, budget, threshold), "chunk_plan")
        broken = _broken_plan(num_tokens, budget, threshold, got)
        assert broken is None, f"chunk_plan({num_tokens}, {budget}, {threshold}) returned {got!r}: {broken}"
    for num_tokens, budget, threshold in ((150, 64, 0), (150, 64, 24), (100, 32, 50)):
        got = within(2.0, partial(impl.chunk_plan, num_tokens, budget, threshold), "chunk_plan")
        broken = _broken_plan(num_tokens, budget, threshold, got)
        assert broken is None, f"chunk_plan({num_tokens}, {budget}, {threshold}) returned {got!r}: {broken}"
    for budget in (0, -1):
        assert _raises_in_time(partial(impl.chunk_plan, 10, budget), ValueError), (
            f"chunk_plan(10, budget={budget}) must raise ValueError: with no budget no step computes a token, so the "
            f"plan would never end"
        )


def _raises_in_time(call, error: type[Exception], seconds: float = 2.0) -> bool:
    """Whether call() raises `error` within `seconds`: a plan that never ends fails the task, not the grader."""
    try:
        within(seconds, call, "chunk_plan")
    except error:
        return True
    except TimeoutError:
        return False
    return False


@pytest.mark.task("07.2", "schedule: running requests and newcomers share one token budget, never overspent")
def test_running_first(impl):
    s = make(impl, budget=10)
    s.add_request(req("a", 3))
    assert (got := plan(s)) == ([("a", 3)], []), (
        f"Output, step 0 (budget 10): expected a alone to run its whole 3-token prompt, got (plan, preempted) {got}"
    )
    s.add_request(req("b", 20, first=100))
    so = step(s)
    got = list(so.num_scheduled_tokens.items())
    turns = [r for r, _ in got]
    assert "a" in turns and turns.index("a") == 0, (
        f"Turns, step 1 (budget 10): a runs, holding a block, and needs 1 token; newcomer b needs 20. Yours plans "
        f"{got}, expected [('a', 1), ('b', 9)]. The property at stake: the blocks the pool has already given out "
        f"do work, and no request starves; {WHERE}"
    )
    assert got == [("a", 1), ("b", 9)], (
        f"Budget, step 1 (budget 10): a (running) takes the 1 token it needs, and newcomer b what is left of the "
        f"budget, 9 of its 20: expected [('a', 1), ('b', 9)], got {got}"
    )
    assert [d.req_id for d in so.scheduled_new_reqs] == ["b"] and so.scheduled_cached_reqs.req_ids == ["a"], (
        f"Output, step 1: b was admitted this step (new_reqs: what admit() returned) and a was already running, so "
        f"make_output should list new ['b'] and cached ['a']; got new {[d.req_id for d in so.scheduled_new_reqs]} "
        f"and cached {so.scheduled_cached_reqs.req_ids}"
    )
    assert _per_group(so.scheduled_cached_reqs.new_block_ids) == [([],)], (
        "Output, step 1: a's decode at position 3 still fits its first block, so allocate_slots gives it no new "
        "block; new_blocks['a'] is that KVCacheBlocks' get_block_ids(), one list per KV cache group, here ([],) "
        f"(one group, empty); make_output got {so.scheduled_cached_reqs.new_block_ids}"
    )
    so = step(s)
    got = (list(so.num_scheduled_tokens.items()), sorted(so.preempted_req_ids))
    assert got == ([("a", 1), ("b", 9)], []), (
        "Output, step 2 (budget 10): expected running a's decode (1) first, then running b's next chunk (9, the "
        f"budget left), got {got}"
    )
    assert _per_group(so.scheduled_cached_reqs.new_block_ids) == [([5],), ([6, 7],)], (
        f"Output, step 2: allocate_slots gives a block 5 and b blocks 6 and 7; new_blocks[req_id] is "
        f"blocks.get_block_ids() of what it returned (a KVCacheBlocks): a tuple with one list of ids per KV cache "
        f"group, vLLM's shape, so ([5],) and ([6, 7],) for this one-group model; make_output got "
        f"{so.scheduled_cached_reqs.new_block_ids}"
    )
    got = plan(s)
    assert got == ([("a", 1), ("b", 2)], []), (
        f"Output, step 3 (budget 10): expected a's decode (1), then the last 2 of b's 20 prompt tokens, got {got}"
    )


@pytest.mark.task("07.2b", "schedule: a prompt longer than the budget still finishes; a spent budget plans no one")
def test_budget(impl):
    s = make(impl, budget=8)
    s.add_request(req("a", 20))
    assert (got := [plan(s)[0] for _ in range(4)]) == [[("a", 8)], [("a", 8)], [("a", 4)], [("a", 1)]], (
        f"steps 0-3 (budget 8): a lone 20-token prompt runs in chunks of 8, 8, 4 (the budget caps each), then "
        f"decodes 1 token; got the plans {got}"
    )
    s = make(impl, budget=8)
    for name in "abc":
        s.add_request(req(name, 6, first=10 * ord(name)))
    assert (got := plan(s)) == ([("a", 6), ("b", 2)], []), (
        f"Budget and Admission, step 0 (budget 8, three 6-token prompts waiting): a takes 6, b the 2 left, and c is "
        f"not admitted, as no budget is left for it; expected ([('a', 6), ('b', 2)], []), got {got}"
    )
    assert (got := plan(s)) == ([("a", 1), ("b", 4), ("c", 3)], []), (
        "Budget, step 1 (budget 8): expected running a's decode (1), running b's last 4 prompt tokens, then newcomer "
        f"c gets the 3 tokens left; got {got}"
    )


@pytest.mark.task("07.3", "schedule: the threshold's cap holds in a busy step and in a quiet one")
def test_threshold(impl):
    s = make(impl, budget=64, long_prefill_token_threshold=16)
    s.add_request(req("a", 40))
    s.add_request(req("b", 30, first=100))
    assert (got := plan(s)) == ([("a", 16), ("b", 16)], []), (
        "Budget, step 0 (budget 64, threshold 16): with a and b waiting, the threshold caps each newcomer's first "
        f"chunk: expected a 16 and b 16, got {got}"
    )
    assert (got := plan(s)) == ([("a", 16), ("b", 14)], []), (
        "Budget, step 1 (budget 64, threshold 16): the threshold caps running requests too: expected a 16 (of the 24 "
        f"it still needs) and b its last 14, got {got}"
    )
    assert (got := plan(s)) == ([("a", 8), ("b", 1)], []), (
        "Budget, step 2 (budget 64, threshold 16): expected a's last 8 prompt tokens and b's first decode (1), got "
        f"{got}"
    )
    s = make(impl, budget=64, long_prefill_token_threshold=16)
    s.add_request(req("alone", 40))
    assert (got := plan(s)) == ([("alone", 40)], []), (
        f"Budget, one request alone (budget 64, threshold 16, a 40-token prompt): nobody to starve, so no threshold "
        f"(self.long_prefill_threshold() is 0 at the step's start); expected ([('alone', 40)], []), got {got}"
    )
    s.add_request(req("next", 30, first=100))
    assert (got := plan(s)) == ([("alone", 1), ("next", 16)], []), (
        f"Budget, two requests (threshold 16): the threshold caps the newcomer's chunk again; expected "
        f"([('alone', 1), ('next', 16)], []), got {got}"
    )


@pytest.mark.task("07.4", "choose_victim: the victim under FCFS and under priority; the others keep their order")
def test_choose_victim(impl):
    # (policy, running as (id, priority, arrival) in admission order, the victim, the property that decides it),
    # the smallest cases first.
    cases = [
        ("fcfs", [("a", 0, 1.0), ("b", 0, 2.0)], "b", "FCFS: the later claim is the victim"),
        (
            "fcfs",
            [("a", 0, 2.0), ("b", 0, 1.0)],
            "b",
            "FCFS: a claim dates from the latest admission, not from arrival (b, readmitted, came after a)",
        ),
        ("priority", [("a", 0, 2.0), ("b", 1, 0.5)], "b", "priority: a larger priority value is a worse rank"),
        ("priority", [("a", 1, 0.5), ("b", 0, 2.0)], "a", "priority: a larger priority value is a worse rank"),
        (
            "priority",
            [("a", 0, 2.0), ("b", 0, 1.0)],
            "a",
            "priority: between equal priorities the later arrival is worse",
        ),
        (
            "priority",
            [("a", 0, 1.0), ("b", 0, 1.0)],
            "a",
            "priority: between two equal in priority and arrival, the one earlier in self.running is the victim",
        ),
        (
            "fcfs",
            [("old", 0, 1.0), ("x", 0, 5.0), ("y", 0, 3.0)],
            "y",
            "FCFS: the latest admission is the weakest claim (y, readmitted), not the latest arrival",
        ),
        (
            "priority",
            [("old", 0, 1.0), ("x", 0, 5.0), ("y", 0, 3.0)],
            "x",
            "priority: all priorities are 0 here, so the latest arrival, x (5.0), is the worst",
        ),
        (
            "priority",
            [("a", 0, 1.0), ("b", 5, 2.0), ("c", 0, 3.0)],
            "b",
            "priority: the largest priority value is the worst",
        ),
    ]
    for policy, running, victim, rule in cases:
        s = make(impl, policy=policy)
        s.running = [req(rid, 1, priority, arrival) for rid, priority, arrival in running]
        shown = ", ".join(f"{rid} (priority {p}, arrived {at})" for rid, p, at in running)
        got = s.choose_victim()
        assert getattr(got, "request_id", None) == victim, (
            f"{policy}, running [{shown}] in admission order: {rule}; expected {victim}, your choose_victim returned "
            f"{getattr(got, 'request_id', got)!r}"
        )
        left = [r.request_id for r in s.running]
        assert left == [rid for rid, _, _ in running if rid != victim], (
            f"{policy}, running [{shown}]: the victim {victim} leaves self.running and the others keep their order, "
            f"expected {[rid for rid, _, _ in running if rid != victim]}; self.running is now {left}"
        )


def _two_decoding(impl, policy, num_blocks):
    """a (7 tokens, priority 1) runs; b (5 tokens, priority 0) joins at step 1. Returns the plans."""
    s = make(impl, num_blocks, policy=policy)
    s.add_request(req("a", 7, 1, 0.0))
    plans = [plan(s)]
    s.add_request(req("b", 5, 0, 1.0, first=100))
    plans += [plan(s) for _ in range(6)]
    return s, plans


@pytest.mark.task(
    "07.5",
    "schedule: a refused grant gets room; a victim keeps nothing in the plan and costs no one else a turn",
)
def test_preemption(impl):
    # 6 usable blocks. a holds 3 and b 2 after step 2; at step 6 a's position 12 needs a 4th block,
    # none is free: FCFS takes the tail, b, and a goes on.
    s, plans = _two_decoding(impl, "fcfs", 7)
    assert plans[5] == ([("a", 1), ("b", 1)], []), (
        f"Room, step 5 (FCFS, 6 usable blocks): expected a and b to decode 1 token each with nobody preempted (b's new "
        f"block is the pool's last free one), got {plans[5]}"
    )
    assert plans[6] == ([("a", 1)], ["b"]), (
        "Room, step 6 (FCFS, 6 usable blocks): a's position 12 needs a 4th block and none is free, so FCFS preempts "
        "the newest running request, b, and a decodes 1: expected (plan, preempted) ([('a', 1)], ['b']), got "
        f"{plans[6]}"
    )
    assert s.requests["b"].num_computed_tokens == 0 and s.kv_cache_manager.get_block_ids("b") == ([],), (
        f"after step 6 preempted b: preemption by recompute (self.preempt) frees all its blocks and resets its "
        f"num_computed_tokens to 0; got {s.requests['b'].num_computed_tokens} computed tokens and blocks "
        f"{s.kv_cache_manager.get_block_ids('b')}"
    )
    # 5 usable blocks, priority: at step 5 a (already scheduled this step) is worse than b, whose
    # position 8 needs a block. a is preempted and its token goes back to the budget.
    s, plans = _two_decoding(impl, "priority", 6)
    assert plans[4] == ([("a", 1), ("b", 1)], []), (
        f"Room, step 4 (priority, 5 usable blocks): expected a and b to decode 1 token each in the blocks they hold, "
        f"nobody preempted, got {plans[4]}"
    )
    assert plans[5] == ([("b", 1)], ["a"]), (
        "Room, step 5 (priority, 5 usable blocks): b's position 8 needs a block, none is free, and a (priority 1, "
        "planned earlier in this step) is the worst: a is preempted, leaves the plan and gives its token back; "
        f"expected (plan, preempted) ([('b', 1)], ['a']), got {plans[5]}"
    )
    # The victim's tokens go back to the budget: 7 usable blocks, budget 3, running [a (priority 1), b, c
    # (priority 0)]. Before step 8 a holds 3 blocks (12 tokens computed), b 2 (8), c 1 (4 of its 6), one block is
    # free. a takes it for position 12; b's position 8 then needs a block and a, the worst, is preempted. a's
    # token is budget again, so c, after b, gets the 2 tokens it still needs.
    s = make(impl, 8, budget=3, policy="priority")
    s.add_request(req("a", 7, 1, 0.0))
    plans = [plan(s)]
    s.add_request(req("b", 5, 0, 1.0, first=100))
    plans.append(plan(s))
    s.add_request(req("c", 6, 0, 2.0, first=200))
    plans += [plan(s) for _ in range(7)]
    assert plans[7] == ([("a", 1), ("b", 1), ("c", 1)], []), (
        f"Room, step 7 (priority, 7 usable blocks, budget 3): a, b and c each get 1 token and nobody is preempted; got "
        f"(plan, preempted) {plans[7]}"
    )
    assert plans[8] == ([("b", 1), ("c", 2)], ["a"]), (
        "Room, step 8 (priority, 7 usable blocks, budget 3): a takes the last free block for its token, then b's "
        "position 8 needs a block and a (priority 1) is the worst, so a is preempted and leaves the plan: its 1 token "
        "is budget again, and c, planned after b, gets the 2 tokens it still needs (3 - 1 for b). Expected (plan, "
        f"preempted) ([('b', 1), ('c', 2)], ['a']), got {plans[8]}"
        + (
            ": a victim planned earlier in the step gives its tokens back to the budget"
            if plans[8][0][-1:] == [("c", 1)]
            else ""
        )
    )
    # The requester itself is the victim: it stops, and the running loop goes on, as vLLM 0.33's does: the
    # requests after it rank higher and may fit in the blocks it freed.
    s, plans = _two_decoding(impl, "priority", 7)
    assert plans[6] == ([("b", 1)], ["a"]), (
        "Room, step 6 (priority, 6 usable blocks): a needs a 4th block, none is free and a (priority 1) is the worst, "
        "so a preempts itself; expected b still to run 1 token (under priority the running loop goes on: vLLM 0.33's "
        '"The requests after it have higher priority and may still fit", `continue`), got '
        f"{plans[6]}"
    )
    # Alone: 2 usable blocks, a's 8 tokens fill them; its decode at position 8 needs a third, and nobody else runs.
    s = make(impl, num_blocks=3)
    s.add_request(req("a", 8))
    step(s)
    s.add_request(req("w", 4, first=100))
    so = step(s)
    got = (list(so.num_scheduled_tokens.items()), sorted(so.preempted_req_ids))
    status = s.requests["a"].status.name if "a" in s.requests else "FINISHED_LENGTH_CAPPED"
    assert "a" not in so.preempted_req_ids, (
        "Alone, step 1 (2 usable blocks, a 8-token prompt a alone in running, no drafts): a's decode at position 8 "
        "needs a third block, and nobody else runs. Yours preempted a. The property it breaks: no request waits for "
        "ever for blocks that can never be freed (a has no drafts to drop: readmitted, it would ask for these same tokens "
        "and lookahead slots, which the pool has just refused with nobody else holding a block). "
        f"Expected a ended (FINISHED_LENGTH_CAPPED) and the plan [('w', 4)]; got (plan, preempted) {got}; {WHERE}"
    )
    assert got == ([("w", 4)], []) and status == "FINISHED_LENGTH_CAPPED", (
        "Alone, step 1: a is ended with finish_length_capped (neither planned nor preempted), and ending it is not a "
        "preemption, so the step admits w into the blocks a freed: expected (plan, preempted) ([('w', 4)], []) with "
        f"a FINISHED_LENGTH_CAPPED; got {got}, a {status}"
    )


@pytest.mark.task(
    "07.6", "schedule: a newcomer is admitted only if its admission will hold, and the seats are never exceeded"
)
def test_admission(impl):
    s = make(impl, budget=64, max_num_seqs=2)
    for name in "abc":
        s.add_request(req(name, 4, first=10 * ord(name)))
    assert (got := plan(s)) == ([("a", 4), ("b", 4)], []), (
        f"max_num_seqs=2, three 4-token requests waiting: a and b are admitted, and c waits although budget and "
        f"blocks are left, since two already run; got (plan, preempted) {got}"
    )
    # The gate: 5 usable blocks, budget 8. a (18 tokens, 5 blocks) gets in; b must wait although its
    # first chunk would fit, because its whole prompt would not.
    s = make(impl, num_blocks=6, budget=8)
    s.add_request(req("a", 18))
    assert (got := plan(s)) == ([("a", 8)], []), (
        "Admission, step 0 (5 free blocks, budget 8): a's whole 18-token prompt needs 5 blocks and 5 are free, so the "
        f"gate admits it with a first chunk of 8 (the budget); got {got}"
    )
    s = make(impl, num_blocks=6, budget=16)
    s.add_request(req("a", 8))
    s.add_request(req("b", 20, first=100))
    assert (got := plan(s)) == ([("a", 8)], []), (
        "Admission, step 0 (5 usable blocks, budget 16, a 8 tokens then b 20 waiting): a takes 2 blocks; b's first "
        "chunk of 8 would fit in the 3 left, but its whole 20-token prompt needs 5, so b is not admitted and holds "
        f"nothing; expected ([('a', 8)], []), got {got}. The property at stake: a request admitted is not preempted "
        f"later for want of the blocks its own prompt needs (where would b's later chunks find theirs?); {WHERE}"
    )
    # Head of the queue: a runs; x (16 tokens, 4 blocks) heads the queue and y (4 tokens, 1 block) follows.
    s = make(impl, num_blocks=6)
    s.add_request(req("a", 8))
    step(s)
    s.add_request(req("x", 16, first=100))
    s.add_request(req("y", 4, first=200))
    so = step(s)
    got = (list(so.num_scheduled_tokens.items()), [r.request_id for r in s.waiting])
    assert got == ([("a", 1)], ["x", "y"]) and s.kv_cache_manager.get_block_ids("y") == ([],), (
        "Head of the queue, step 1 (5 usable blocks, FCFS): a decodes into its third block, 2 are left; x, the "
        "queue's head, needs 4 for its whole 16-token prompt and is refused; y behind it needs 1. Expected "
        "(plan, waiting) ([('a', 1)], ['x', 'y']), y holding nothing; got "
        f"{got}. The property at stake: the queue's order is the policy's promise, and a long request is not "
        f"overtaken for ever by the short ones behind it; {WHERE}"
    )
    # Priority: c (priority 0) arrives as a's growth preempts b; c would fit, but nobody is admitted
    # in a preempting step.
    s = make(impl, 7, policy="priority")
    s.add_request(req("a", 7, 1, 0.0))
    s.add_request(req("b", 7, 1, 1.0, first=100))
    for _ in range(6):
        step(s)
    s.add_request(req("c", 3, 0, 2.0, first=200))
    so = step(s)
    got = (list(so.num_scheduled_tokens.items()), sorted(so.preempted_req_ids))
    admitted = [r.req_id for r in so.scheduled_new_reqs]
    assert got == ([("a", 1)], ["b"]) and admitted == [], (
        "Admission, step 6 (priority, 6 usable blocks): a's next token needs a block, so b (priority 1, arrived "
        "later) is preempted; c (priority 0) arrived, and its prompt would fit. Expected (plan, preempted) "
        f"([('a', 1)], ['b']) and nobody admitted; got {got}, admitted {admitted}, waiting "
        f"{[r.request_id for r in s.waiting]}. The property at stake: what this step has just shown about the pool "
        f"and the requests that run; {WHERE}"
    )
    assert (got := plan(s)) == ([("a", 1), ("c", 3)], []), (
        "Admission, step 7 (priority): nobody preempted now, so a decodes 1 and c (priority 0, ahead of the preempted "
        f"b in the waiting queue) is admitted with its whole 3-token prompt; got {got}"
    )


@pytest.mark.task("07.7", "your scheduler runs the engine: same tokens, same step timeline, through preemption")
def test_runs_the_engine(impl):
    from nanocourse.timeline import record_run, timeline_text
    from nanoengine import LLM
    from nanoengine.config import LlamaConfig
    from nanoengine.model import LlamaForCausalLM

    model = LlamaForCausalLM.random(LlamaConfig.tiny(), seed=0, std=0.2)  # outputs that depend on the context
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    load = {
        0: [(list(range(10 + 10 * i, 23 + 10 * i)), params) for i in range(3)],
        2: [(list(range(200, 206)), params)],
    }

    class Checked(impl.Scheduler):
        """Yours, each plan checked as schedule() hands it over (nanocourse.plan_rules)."""

        def schedule(self):
            return checked_schedule(self, super().schedule)

    def run(scheduler_cls, num_blocks):
        llm = LLM(
            model,
            block_size=4,
            num_gpu_blocks_override=num_blocks,
            max_num_batched_tokens=16,
            scheduler_cls=scheduler_cls,
        )
        return record_run(llm.engine, load)

    yours, engine, roomy = run(Checked, 15), run(Scheduler, 15), run(Scheduler, 64)
    assert sum(len(r.preempted) for r in yours.records) >= 2, "a 14-block pool forces preemption"
    assert not any(r.preempted and r.admitted for r in yours.records), next(
        (
            f"step {r.step} preempted {list(r.preempted)} and admitted {[a.req_id for a in r.admitted]}, where the "
            f"engine's admits nobody (admission after a preemption, task 07.6)"
            for r in yours.records
            if r.preempted and r.admitted
        ),
        "a step that preempted admitted a request, where the engine's admits nobody (task 07.6)",
    )
    tokens = [yours.outputs[i].token_ids for i in yours.req_ids]
    assert tokens == [roomy.outputs[i].token_ids for i in roomy.req_ids], "recompute must not change the output"
    assert timeline_text(yours.records) == timeline_text(engine.records), (
        f"same load on 14 usable blocks, budget 16: your step timeline must be the engine's; "
        f"{_first_difference(timeline_text(yours.records), timeline_text(engine.records))}"
    )


# ---- 07.8: your scheduler beside the engine's, over random workloads ---------------------------------------


# The learner's drafts near max_model_len, told step by step: an 8-token prompt under max_model_len 14 with 3 drafts
# a step, where step 2 may schedule 1 token and no more (positions 12 and 13 are off limits).
_CAPPED_EXAMPLE = (
    {
        "num_blocks": 12,
        "budget": 64,
        "policy": "fcfs",
        "caching": False,
        "threshold": 0,
        "max_num_seqs": 4,
        "num_speculative_tokens": 3,
        "max_model_len": 14,
        "num_lookahead_tokens": 0,
    },
    [("add", 8, 0, 0, 20, False), ("step", 3)],
)
# Lookahead slots cut at max_model_len: 3 drafts and 4 lookahead slots a step under max_model_len 16.
_LOOKAHEAD_EXAMPLE = (
    {**_CAPPED_EXAMPLE[0], "budget": 8, "max_model_len": 16, "num_lookahead_tokens": 4, "max_num_seqs": 2},
    [("add", 5, 0, 0, 20, False), ("add", 3, 1, 0, 20, False), ("step", 2)],
)


# What 07.8 says when a step parts: the decision behind the first difference and the property at stake; the
# failure below it shows both plans. vLLM 0.33's rule and its reason come after, in the hints and reveal (WHERE).
DECISIONS = {
    "turns": "turn order, the running requests' or the newcomers'. The property at stake: the blocks the pool has "
    "already given out do work, and no request starves",
    "admission after a preemption": "admission in a step that made room for a running request. The property at "
    "stake: what that step has just shown about the pool and the requests that run",
    "gate": "the admission gate. The property at stake: a request admitted is not preempted later for want of the "
    "blocks its own prompt needs, with nothing reserved for it in the meantime (the pool as it is)",
    "head of the queue": "the head of the queue. The property at stake: the queue's order is the policy's promise, "
    "and a long request is not overtaken for ever by the short ones behind it",
    "alone": "a lone running request whose grant is refused. The properties at stake: no request waits for ever for "
    "blocks that can never be freed, and none is ended that could still run (what does a preemption drop, and "
    "what does the request ask for again when it comes back: its drafts, its lookahead slots?)",
    "never fits": "ending a request that can never fit. A request is ended only when its grant is refused with "
    "nothing left to free: a lone running request, or a waiting request refused while nothing runs (and then it "
    "holds up nobody behind it). Where one side ended a request the other ran, compare what the two grants asked "
    "for it: its tokens past its cache hit, its padding, its lookahead slots",
    "room": "making room. The properties: as few victims as possible, taken in the order choose_victim() names "
    "them, each followed by a new try of the grant, until it is granted or the requester itself is taken; a victim "
    "planned earlier in the step leaves the plan, gives its budget back, and costs no request after it its turn",
    "drafting slots": "the budget with drafting slots. Each planned request costs its tokens plus "
    "max_num_new_slots_for_drafting of the budget, a victim's come back with its tokens, and a planned request "
    "still gets at least 1 token",
    "padding": "padding. vLLM 0.33 pads a newcomer that joins running decodes to 1 + k tokens, k of them "
    "placeholders (`pad_spec_decode`); padded_size decides from the running requests the running pass planned, "
    "not the newcomers admitted this step, and a padded newcomer gets exactly 1 + k tokens or nobody more is "
    "admitted",
    "max_model_len": "the max_model_len cap. vLLM 0.33 schedules a running request's tokens and drafts up to "
    'position max_model_len - 2 and no further ("Make sure the input position does not exceed the max model '
    'len"): the token sampled after the last one needs a position too',
    "budget": "the budget. A planned request gets what chunk_size grants its need (drafts included) from the budget "
    "left at its turn, under the threshold in force when the step started",
    "lookahead": "the lookahead slots. Every grant, a running request's and a newcomer's, holds "
    "num_lookahead_tokens slots past its planned tokens, none at max_model_len or past it (a draft model writes its "
    "own KV there)",
    "stats": "the prefix-cache lookup count. Each admitted request's lookup counts exactly once, at its admission, "
    "and a request left waiting adds no count, however often a step looks up its hit",
}


def _recording(cls: type) -> type:
    """cls, keeping what its last schedule() started from and returned (for 07.8's diagnosis)."""

    class Recording(cls):
        last: dict | None = None
        ended: list[str]

        def finish_length_capped(self, request):
            self.ended.append(request.request_id)
            super().finish_length_capped(request)

        def schedule(self):
            self.last = {
                "running": [r.request_id for r in self.running],
                "waiting": [r.request_id for r in self.waiting],
            }
            self.ended = []
            so = super().schedule()
            self.last.update(so=so, capped=list(self.ended))
            return so

    return Recording


def _decision(cfg: dict, mine: dict | None, theirs: dict | None, field: str) -> str | None:
    """The decision (a key of DECISIONS) behind the first step where yours and the engine's part, from what each
    started with and returned at that step, and the failure's first line (`field`, the observation that differs);
    None when it cannot tell, or when the plan broke a rule as schedule() returned it (its message names the rule)."""
    if "breaks a rule" in field or not mine or not theirs or mine.get("so") is None or theirs.get("so") is None:
        return None
    ys, es = mine["so"], theirs["so"]
    running = theirs["running"]  # both agreed on every step before, so both started the same
    yplan, eplan = list(ys.num_scheduled_tokens.items()), list(es.num_scheduled_tokens.items())
    ynew, enew = [d.req_id for d in ys.scheduled_new_reqs], [d.req_id for d in es.scheduled_new_reqs]
    slots, k = cfg.get("max_num_new_slots_for_drafting", 0), cfg.get("num_speculative_tokens", 0)
    if ys.preempted_req_ids and ynew:
        return "admission after a preemption"
    if mine["capped"] != theirs["capped"]:
        lone = len(running) == 1 and running[0] in {*mine["capped"], *theirs["capped"]}
        return "alone" if lone else "never fits"
    if sorted(ys.preempted_req_ids) != sorted(es.preempted_req_ids):
        return "alone" if len(running) == 1 else "room"
    yours, engine = dict(yplan), dict(eplan)
    if es.preempted_req_ids and any(r in running and r not in yours for r in engine):
        return "room"  # a victim left the plan and someone after it lost the turn
    order = [r for r, _ in yplan]
    if any(order.index(n) < order.index(r) for n in ynew if n in order for r in order if r in running):
        return "turns"
    if ynew != enew:
        common = longest_common_prefix(ynew, enew)
        if common < len(ynew) and common == len(enew):  # yours admitted one the engine did not
            head = next((r for r in theirs["waiting"] if r not in enew and r not in theirs["capped"]), None)
            if ynew[common] != head:
                return "head of the queue"
        if k and any(n == 1 + k for r, n in (*yplan, *eplan) if r in (*ynew, *enew)):
            return "padding"
        # The side that admitted fewer stopped there. Its drafting slots stopped it only if no more than them was
        # left of the budget; with more left, a grant was refused (the whole-sequence gate) or the seats were full.
        stopped = es if common == len(enew) else ys
        planned = stopped.num_scheduled_tokens
        left = cfg["budget"] - sum(planned.values()) - slots * len(planned)
        return "drafting slots" if slots and left <= slots else "gate"
    if yplan != eplan:
        r = next(r for r in (*engine, *yours) if engine.get(r) != yours.get(r))
        if r in enew and k and engine.get(r) == 1 + k or yours.get(r) == 1 + k and r in ynew and k:
            return "padding"
        if slots and sum(yours.values()) != sum(engine.values()):
            return "drafting slots"
        if r in running and engine.get(r) is not None and yours.get(r, 0) > engine[r] and "max_model_len" in cfg:
            return "max_model_len"
        return "budget"
    if sorted(ys.scheduled_spec_decode_tokens.items()) != sorted(es.scheduled_spec_decode_tokens.items()):
        return "padding"
    # The same plan, and yet the state differs: the field the failure names tells which.
    if "prefix-cache stats" in field:
        return "stats"
    return "lookahead" if "block" in field and cfg.get("num_lookahead_tokens") else None


# A victim planned earlier in the step gives back its drafting slot with its tokens: at step 6 c gets 3, not 2.
_DRAFTING_REFUND_EXAMPLE = (
    {
        "num_blocks": 7,
        "budget": 6,
        "policy": "priority",
        "caching": False,
        "threshold": 0,
        "max_num_seqs": 4,
        "max_num_new_slots_for_drafting": 1,
    },
    [("add", 5, 0, 1, 20, False), ("step", 1), ("add", 5, 1, 0, 20, False), ("step", 1)]
    + [("add", 6, 2, 0, 20, False), ("step", 8)],
)

# A lone request that only its lookahead slots make too big is ended: a preemption would not drop them.
_ALONE_LOOKAHEAD_EXAMPLE = (
    {
        "num_blocks": 3,
        "budget": 16,
        "policy": "fcfs",
        "caching": False,
        "threshold": 0,
        "max_num_seqs": 4,
        "num_lookahead_tokens": 3,
    },
    [("add", 4, 0, 0, 20, False), ("step", 3)],
)


@pytest.mark.task("07.8", "under random workloads your scheduler plans every step as the engine's does")
@settings(max_examples=1000)
@given(
    workload=st.one_of(
        scheduler_workloads(
            num_speculative_tokens=st.sampled_from([0, 0, 2]),
            num_lookahead_tokens=st.sampled_from([0, 0, 0, 3]),
            max_num_new_slots_for_drafting=st.sampled_from([0, 0, 1]),
        ),
        capped_workloads(
            num_speculative_tokens=st.sampled_from([1, 2, 3]), num_lookahead_tokens=st.sampled_from([0, 2, 4])
        ),
    )
)
@example(workload=_CAPPED_EXAMPLE)
@example(workload=_DRAFTING_REFUND_EXAMPLE)
@example(workload=_ALONE_LOOKAHEAD_EXAMPLE)
@example(workload=_LOOKAHEAD_EXAMPLE)
def test_matches_the_engine(impl, workload):
    """Both schedulers get the same requests on their own KVCacheManager; after each step every plan, block, queue
    and counter must agree. At the end both run until every request has finished (at most 60 steps). Many workloads
    give every running request drafts each step (chapter 13), reserve lookahead slots, or set a max_model_len small
    enough to cut both. Every plan is also checked as your schedule() hands it over (nanocourse.plan_rules)."""
    cfg, ops = workload

    pair = {}

    def recorded(yours: bool) -> Scheduler:
        pair[yours] = _recording(impl.Scheduler if yours else Scheduler)(
            scheduler_config(cfg), KVCacheManager(BS, cfg["num_blocks"], cfg["caching"])
        )
        return pair[yours]

    try:
        replay_workload(
            recorded, cfg, ops, BS, f"{cfg['num_blocks'] - 1} usable blocks of {BS} tokens", plan_rules=True
        )
    except AssertionError as error:
        decision = _decision(cfg, pair[True].last, pair[False].last, str(error).split("\n")[0])
        if decision is None:
            raise
        detail = ""
        if decision == "drafting slots":  # the budget each side spent, drafting slots included
            slots = cfg["max_num_new_slots_for_drafting"]
            spent = {
                who: (sum(n := s.last["so"].num_scheduled_tokens.values()), len(n))
                for who, s in (("yours", pair[True]), ("the engine's", pair[False]))
            }
            detail = "; at that step " + " and ".join(
                f"{who} plans {t} tokens for {m} requests, {t + m * slots} of the budget {cfg['budget']} with their "
                f"drafting slots"
                for who, (t, m) in spent.items()
            )
        raise AssertionError(f"The decision that differs: {DECISIONS[decision]}{detail}; {WHERE}.\n{error}") from None


@pytest.mark.task("07.9", "schedule: lookahead slots past the scheduled tokens, never past max_model_len")
def test_lookahead(impl):
    s = make(impl, num_blocks=10, num_lookahead_tokens=4)
    s.add_request(req("a", 4))
    so = step(s)
    got = per_group(so.scheduled_new_reqs[0].block_ids) if so.scheduled_new_reqs else None
    assert got == ([1, 2],), (
        "Lookahead, num_lookahead_tokens=4, blocks of 4 tokens: a 4-token prompt is admitted with slots for its 4 "
        "tokens and 4 lookahead slots past them (a draft model's own KV), 8 slots, so blocks ([1, 2],); yours gave a "
        f"{got}"
    )
    so = step(s)
    got = _per_group(so.scheduled_cached_reqs.new_block_ids)
    assert got == [([3],)], (
        "Lookahead, step 1 (num_lookahead_tokens=4): a decodes position 4, and its slots reach position 8 with the "
        f"lookahead, a third block: expected new blocks [([3],)], got {got}"
    )
    s = make(impl, num_blocks=10, num_lookahead_tokens=5, max_model_len=7)
    s.add_request(req("a", 4))
    so = step(s)
    got = per_group(so.scheduled_new_reqs[0].block_ids) if so.scheduled_new_reqs else None
    assert got == ([1, 2],), (
        "Lookahead, num_lookahead_tokens=5, max_model_len=7: the lookahead stops at max_model_len, so a 4-token "
        "prompt gets slots for positions 0 to 6 (3 lookahead slots, not 5), 2 blocks: expected ([1, 2],), yours gave "
        f"a {got}"
    )
    so = step(s)
    got = _per_group(so.scheduled_cached_reqs.new_block_ids)
    assert got == [([],)], (
        f"Lookahead, step 1 (num_lookahead_tokens=5, max_model_len=7): a decodes position 4 and its lookahead stops at "
        f"max_model_len, so its 2 blocks already hold every slot: expected no new block [([],)], got {got}"
    )


STARVATION_FACTOR = 1.25  # steps a workload may take, next to vLLM's rule on it, before someone counts as starved


@pytest.mark.task("07.10", "your victim order: every rule kept, nobody starved, fewer tokens recomputed than the bar")
def test_victim_design(impl):
    class Checked(impl.VictimDesign):
        """Yours, each victim checked as choose_victim() hands it over."""

        def choose_victim(self):
            before = [r.request_id for r in self.running]
            victim = super().choose_victim()
            after = [r.request_id for r in self.running]
            assert victim.request_id in before and after == [r for r in before if r != victim.request_id], (
                f"choose_victim must take one running request out of self.running and leave the others in their "
                f"order: running was {before}, you returned {victim.request_id!r}, running is now {after}"
            )
            return victim

    vllm, yours = measure(Scheduler), measure(Checked)
    for theirs, mine in zip(vllm, yours):
        unfinished = [rid for rid, at in mine.finished.items() if at is None]
        assert not unfinished, f"{mine.workload!r}: {unfinished} never finished in {MAX_STEPS} steps: starved"
        limit = int(STARVATION_FACTOR * theirs.steps)
        late = {rid: at for rid, at in mine.finished.items() if at >= limit}
        assert not late, (
            f"{mine.workload!r}: {late} finished at step(s) past {limit - 1}, {STARVATION_FACTOR} times the "
            f"{theirs.steps} steps vLLM's rule takes there: a victim order may not starve a request"
        )
        assert mine.blocks_held == 0, f"{mine.workload!r}: {mine.blocks_held} blocks still held after every request"
    recomputed, theirs_in_all = sum(m.recomputed for m in yours), sum(t.recomputed for t in vllm)
    if recomputed >= bar():  # the first idea and the worst workloads are measured only for the message
        first_idea = sum(r.recomputed for r in measure(FewestComputedFirst))
        worst = sorted(zip(yours, vllm), key=lambda pair: pair[1].recomputed - pair[0].recomputed)[:3]
        pytest.fail(
            f"tokens computed a second time over the {len(yours)} workloads of nanocourse.victims.WORKLOADS: yours "
            f"{recomputed} ({recomputed / theirs_in_all:.2f} of vLLM's rule's {theirs_in_all}); the bar is fewer "
            f"than {bar()} ({BAR_FRACTION} of vLLM's rule). The fewest computed tokens first recomputes {first_idea} "
            f"({first_idea / theirs_in_all:.2f}): a rule that weighs only what a victim has done or holds does not "
            f"beat vLLM's. What else decides what a preemption costs the step after it, and the ones after that? "
            f"Where yours loses most to vLLM's rule: "
            + ", ".join(f"{m.workload!r} {m.recomputed} against {t.recomputed}" for m, t in worst)
        )
    for name in STARVING:  # built to starve: a rule that takes the same request again and again fails here
        theirs, mine = replay(Scheduler, name), replay(Checked, name)
        limit = int(STARVATION_FACTOR * theirs.longest_stay())
        stays = {rid: (at or MAX_STEPS) - mine.arrived[rid] for rid, at in mine.finished.items()}
        late = {rid: stay for rid, stay in stays.items() if stay > limit}
        assert not late, (
            f"{name!r} (nanocourse.victims.STARVING: a 40-token prompt, r0, among twelve 8-token ones arriving every "
            f"3 steps): {late} stayed that many steps from arrival to finish, more than {limit}, {STARVATION_FACTOR} "
            f"times the longest any request stays under vLLM's rule ({theirs.longest_stay()}): a victim order may "
            f"not starve a request. Which request does yours take at each preemption, and what stops it taking the "
            f"same one again?"
        )
