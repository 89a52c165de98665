"""Differential grading: drive the learner's part and the engine's own part (or the contract as a plain
model) side by side through the same random operations, and compare everything observable after each one.

A grader builds a Story as it replays hypothesis's operations, then calls story.compare(yours, engine)
with two dicts of the same observable fields, each named in words ("the free queue, head to tail").
The first field that differs fails the task with the operations that led there; hypothesis shrinks
them first, so the failure shows the shortest sequence it found.
"""

from __future__ import annotations

import functools
import reprlib
import signal
from collections.abc import Callable
from typing import Any

from hypothesis import strategies as st

from nanocourse.plan_rules import PlanError, checked_schedule
from nanoengine.core import get_request_block_hasher
from nanoengine.core.sched.scheduler import Scheduler, SchedulerConfig
from nanoengine.request import Request, RequestStatus
from nanoengine.sampling_params import SamplingParams
from nanoengine.worker.outputs import ModelRunnerOutput

_short = reprlib.Repr()
_short.maxlist = _short.maxtuple = _short.maxdict = 12
_short.maxstring = _short.maxother = 120


def short(value: Any) -> str:
    return _short.repr(value)


def first_difference(
    yours: dict[str, Any], engine: dict[str, Any], reference: str = "the engine's", subject: str = "yours"
) -> str | None:
    """The first field, in the dicts' order, whose values differ, in words; None when all agree."""
    for field, expected in engine.items():
        got = yours.get(field)
        if got != expected:
            return f"{field}: {subject} {short(got)}, {reference} {short(expected)}"
    return None


class Story:
    """The operations replayed so far, in words, for a failure message."""

    def __init__(self, setup: str, reference: str = "the engine's", subject: str = "yours") -> None:
        self.setup, self.reference, self.subject = setup, reference, subject
        self.lines: list[str] = []

    def add(self, line: str) -> None:
        self.lines.append(line)

    def fail(self, rule: str) -> AssertionError:
        steps = "\n".join(f"  {i}. {line}" for i, line in enumerate(self.lines, 1))
        return AssertionError(f"{rule}\nthe shortest sequence hypothesis found that shows it ({self.setup}):\n{steps}")

    def call(self, what: str, fn: Callable[..., Any], *args: Any, expected: tuple[type[Exception], ...] = ()) -> Any:
        """fn(*args) on the learner's part; an exception other than NotImplementedError (a stub, which the grader
        reports as such) or one of `expected` (which the contract asks for) fails with the operations that led
        to it."""
        try:
            return fn(*args)
        except (NotImplementedError, *expected):
            raise
        except Exception as error:
            raise self.fail(f"{what} raised {type(error).__name__}: {error}") from error

    def compare(self, yours: dict[str, Any], engine: dict[str, Any]) -> None:
        """Fail on the first observable field where the learner's part and the engine's disagree."""
        difference = first_difference(yours, engine, self.reference, self.subject)
        if difference is not None:
            where = self.lines[-1].split(":")[0] if self.lines else "at the start"
            raise self.fail(f"{where}: {difference}")


def within(seconds: float, call: Callable[[], Any], what: str) -> Any:
    """call(), failing with a TimeoutError that names `what` if it runs longer than `seconds` (a loop that never
    ends fails the task, not the grader). Windows has no interval timer: there the call runs unguarded."""
    if not hasattr(signal, "setitimer"):
        return call()

    def stop(*_):
        raise TimeoutError(f"{what} did not return within {seconds:g} s: does a loop never end?")

    previous = signal.signal(signal.SIGALRM, stop)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        return call()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


# ---- scheduler workloads: chapters whose part serves requests (07's scheduler, 12's window manager) ---------

# A request: prompt length, its prefix family (same family, same leading tokens), priority, max_tokens, and
# whether it asks for prompt logprobs (then it skips reading the prefix cache).
_ADD = st.tuples(
    st.just("add"),
    st.integers(1, 20),
    st.integers(0, 2),
    st.integers(0, 3),
    st.integers(1, 20),
    st.sampled_from([False, False, False, True]),
)
_OPS = st.lists(
    st.one_of(
        _ADD, _ADD, st.tuples(st.just("step"), st.integers(1, 3)), st.tuples(st.just("abort"), st.integers(0, 9))
    ),
    min_size=1,
    max_size=20,
)
_CONFIG = {
    "num_blocks": st.integers(3, 12),
    "budget": st.integers(1, 32),
    "policy": st.sampled_from(["fcfs", "priority"]),
    "caching": st.booleans(),
    "threshold": st.sampled_from([0, 0, 3, 8]),
    "max_num_seqs": st.integers(1, 6),
}
# Pressure, where plain random workloads seldom go: a low-ranked request runs, then better-ranked ones arrive on
# a tight pool with a small budget, so a request preempts one that this very step has already scheduled.
_PRESSURE_CONFIG = {
    "num_blocks": st.integers(4, 10),
    "budget": st.integers(2, 6),
    "policy": st.just("priority"),
    "caching": st.booleans(),
    "threshold": st.just(0),
    "max_num_seqs": st.integers(3, 5),
}
_PRESSURE_OPS = st.builds(
    lambda first, burst, steps: [first, ("step", 1), *burst, ("step", steps)],
    st.tuples(st.just("add"), st.integers(1, 6), st.just(0), st.just(3), st.just(20), st.just(False)),
    st.lists(
        st.tuples(
            st.just("add"), st.integers(1, 6), st.integers(0, 2), st.integers(0, 2), st.integers(4, 20), st.just(False)
        ),
        min_size=2,
        max_size=4,
    ),
    st.integers(1, 3),
)
MAX_DRAIN_STEPS = 60


def scheduler_workloads(**extra: st.SearchStrategy) -> st.SearchStrategy:
    """(config, operations): half plain random workloads, half pressure; `extra` adds config keys (a window)."""
    return st.one_of(
        st.tuples(st.fixed_dictionaries({**_CONFIG, **extra}), _OPS),
        st.tuples(st.fixed_dictionaries({**_PRESSURE_CONFIG, **extra}), _PRESSURE_OPS),
    )


def _shorter(op: tuple, longest: int) -> tuple:
    return (op[0], min(op[1], longest), *op[2:]) if op[0] == "add" else op


def capped_workloads(**extra: st.SearchStrategy) -> st.SearchStrategy:
    """(config, operations) where max_model_len binds: prompts of at most 12 tokens, max_tokens up to 20, and a
    max_model_len of 13 to 22, so requests end at it and the drafts (with extra's num_speculative_tokens) and the
    lookahead slots (num_lookahead_tokens) of a request near it are cut."""
    config = {**_CONFIG, "max_model_len": st.integers(13, 22), **extra}
    return st.tuples(st.fixed_dictionaries(config), _OPS.map(lambda ops: [_shorter(op, 12) for op in ops]))


def scheduler_config(cfg: dict) -> SchedulerConfig:
    return SchedulerConfig(
        max_num_batched_tokens=cfg["budget"],
        max_num_seqs=cfg["max_num_seqs"],
        policy=cfg["policy"],
        long_prefill_token_threshold=cfg["threshold"],
        num_spec_tokens=cfg.get("num_speculative_tokens", 0),
        **{
            key: cfg[key]
            for key in ("max_model_len", "num_lookahead_tokens", "max_num_new_slots_for_drafting")
            if key in cfg
        },
    )


def per_group(block_ids: Any) -> Any:
    """Block ids per KV cache group, as a tuple of lists (what vLLM's KVCacheBlocks.get_block_ids() returns), so a
    tuple and a list of the same groups compare equal; anything else (a bare list of ints, None) is kept as it is,
    so a part that sends one list where the engine sends one per group shows as a difference."""
    if isinstance(block_ids, (list, tuple)) and block_ids and all(isinstance(g, (list, tuple)) for g in block_ids):
        return tuple(list(g) for g in block_ids)
    return block_ids


def _observe(scheduler: Scheduler, so, finished, spec: bool = False) -> dict[str, Any]:
    """Everything a step shows of a scheduler and its KV cache manager, each named for a failure message.
    Block ids are per KV cache group (a one-group model's read ([3, 4],)), as the scheduler sends them. With
    speculation on, also the drafts each request verified, every request's computed tokens and the blocks the
    prefix cache names."""
    kv = scheduler.kv_cache_manager
    stats = kv.make_prefix_cache_stats()
    cached = so.scheduled_cached_reqs
    drafts = (
        {}
        if not spec
        else {
            "the drafts each request verifies this step (scheduled_spec_decode_tokens)": sorted(
                so.scheduled_spec_decode_tokens.items()
            ),
            "each request's num_computed_tokens after the step": {
                r: scheduler.requests[r].num_computed_tokens for r in sorted(scheduler.requests)
            },
            "the blocks the prefix cache names (block id, hash)": sorted(
                (b.block_id, h) for h, b in kv.block_pool.cached_block_hash_to_block.items()
            ),
        }
    )
    return {
        **drafts,
        "the requests preempted": sorted(so.preempted_req_ids),
        "the requests admitted (with the prompt tokens that were cache hits)": [
            (d.req_id, d.num_computed_tokens) for d in so.scheduled_new_reqs
        ],
        "the tokens scheduled, in order (request, tokens)": list(so.num_scheduled_tokens.items()),
        "the new block ids of the running requests, per KV cache group": [
            (r, per_group(ids)) for r, ids in zip(cached.req_ids, cached.new_block_ids)
        ],
        "the requests that finished, with why": sorted((r.request_id, r.status.name) for r in finished),
        "the running list, in order": [r.request_id for r in scheduler.running],
        "the waiting queue, in order": [r.request_id for r in scheduler.waiting],
        "each request's blocks, per KV cache group": {
            r: per_group(kv.get_block_ids(r)) for r in sorted(scheduler.requests)
        },
        "the free queue, head to tail": [b.block_id for b in kv.block_pool.free_block_queue.get_all_free_blocks()],
        "the prefix-cache stats (lookups, tokens queried, tokens hit, readmissions)": stats
        and (stats.requests, stats.queries, stats.hits, stats.preempted_requests),
    }


def _sampled(req_id: str, position: int) -> int:
    """The token 'sampled' for a request at a position: the same in both runs, and different across positions."""
    return 500 + (sum(map(ord, req_id)) * 31 + position * 7) % 97


def _drafts(req_id: str, num_tokens: int, k: int) -> list[int]:
    """k drafts for the tokens at num_tokens onwards: each the token _sampled will give there, except that about
    one in three is wrong, so that verify steps accept all, some or none of them."""
    return [
        _sampled(req_id, p) + ((sum(map(ord, req_id)) + p * num_tokens) % 3 == 0)
        for p in range(num_tokens, num_tokens + k)
    ]


def _verified(req_id: str, request, drafts: list[int]) -> list[int]:
    """A verify step's tokens as a greedy rejection sampler gives them when the model's token at position p is
    _sampled(req_id, p): the drafts up to the first wrong one, then the model's own token there."""
    n = request.num_tokens
    accepted = next((i for i, d in enumerate(drafts) if d != _sampled(req_id, n + i)), len(drafts))
    return [_sampled(req_id, n + i) for i in range(accepted + 1)]


def replay_workload(
    build: Callable[[bool], Scheduler],
    cfg: dict,
    ops: list,
    block_size: int,
    pool_text: str,
    plan_rules: bool = False,
    reference: str = "the engine",
    subject: str = "yours",
    observe: Callable[..., dict[str, Any]] | None = None,
) -> None:
    """Replay ops on build(True) (the learner's) and build(False) (the engine's) without a model, comparing every
    step; at the end both step until every request has finished (at most MAX_DRAIN_STEPS). plan_rules: check the
    learner's every SchedulerOutput as schedule() hands it over (nanocourse.plan_rules), so a plan that breaks a
    rule is named before anything consumes it. reference and subject name build(False)'s and build(True)'s sides in
    the story (the graduation compares nanoengine's parts against vLLM's own Scheduler); observe(scheduler, output, finished, spec) replaces _observe."""
    observe = observe or _observe
    pair = {"yours": build(True), "engine": build(False)}
    k = cfg.get("num_speculative_tokens", 0)  # > 0: every running request verifies k drafts a step
    hasher = get_request_block_hasher(block_size)
    extra = "".join(f", {k} {v}" for k, v in cfg.items() if k not in {**_CONFIG})
    story = Story(
        f"{pool_text}, budget {cfg['budget']}, {cfg['policy']}, prefix caching "
        f"{'on' if cfg['caching'] else 'off'}, long_prefill_token_threshold {cfg['threshold']}, "
        f"max_num_seqs {cfg['max_num_seqs']}{extra}",
        f"{reference}'s",
        subject,
    )
    names, steps = [], [0]

    def one_step(why: str = "") -> None:
        seen = {}
        for who, s in pair.items():
            if who == "engine":
                so = s.schedule()
            else:
                try:
                    so = within(
                        2,
                        functools.partial(
                            story.call,
                            f"step {steps[0]}{why}: schedule()",
                            functools.partial(checked_schedule, s) if plan_rules else s.schedule,
                            expected=(PlanError,),
                        ),
                        f"schedule() at step {steps[0]}",
                    )
                except PlanError as error:  # the plan broke a rule as it was handed over: say which, before use
                    story.add(f"step {steps[0]}{why}: your schedule() plans {short(error.plan)}")
                    raise story.fail(f"step {steps[0]}{why}: {error}") from None
            # A request past its prompt gets a token, after the drafts its scheduled tokens cover (the verified
            # ones and one more); a prompt chunk short of the end gets none.
            spec, reqs = so.scheduled_spec_decode_tokens, s.requests
            sampled = {
                r: _verified(r, reqs[r], spec.get(r, [])[: reqs[r].num_computed_tokens - reqs[r].num_tokens])
                for r in so.num_scheduled_tokens
                if r in reqs and reqs[r].num_computed_tokens >= reqs[r].num_tokens
            }
            output = ModelRunnerOutput(sampled)
            finished = (
                s.update_from_output(so, output)
                if who == "engine"
                else story.call(f"step {steps[0]}{why}: update_from_output()", s.update_from_output, so, output)
            )
            if k:  # what the engine's proposer does between steps: drafts for every request that still runs
                s.update_draft_token_ids({r.request_id: _drafts(r.request_id, r.num_tokens, k) for r in s.running})
            seen[who] = (
                observe(s, so, finished, bool(k))
                if who == "engine"
                else story.call(f"step {steps[0]}{why}: reading the state", observe, s, so, finished, bool(k))
            )
        engine = seen["engine"]
        plan = ", ".join(f"{r} {n}" for r, n in engine["the tokens scheduled, in order (request, tokens)"]) or "nothing"
        preempted = engine["the requests preempted"]
        story.add(
            f"step {steps[0]}{why}: {reference} schedules {plan}" + (f"; preempts {preempted}" if preempted else "")
        )
        steps[0] += 1
        story.compare(seen["yours"], engine)

    for op in ops:
        if op[0] == "add":
            _, length, family, priority, max_tokens, prompt_logprobs = op
            name = "abcdefghijklmnopqrstuvwxyz"[len(names)]
            names.append(name)
            story.add(
                f"add request {name}: a {length}-token prompt (prefix family {family}), priority {priority}, "
                f"max_tokens {max_tokens}"
                + (", prompt_logprobs=1 (it skips reading the prefix cache)" if prompt_logprobs else "")
            )
            for s in pair.values():
                params = SamplingParams(
                    max_tokens=max_tokens, ignore_eos=True, prompt_logprobs=1 if prompt_logprobs else None
                )
                s.add_request(
                    Request(
                        name,
                        [1000 * family + j for j in range(length)],
                        priority=priority,
                        arrival_time=float(len(names)),
                        block_hasher=hasher,
                        sampling_params=params,
                    )
                )
        elif op[0] == "step":
            for _ in range(op[1]):
                one_step()
        elif names:
            name = names[op[1] % len(names)]
            story.add(f"abort request {name}")
            for s in pair.values():
                story.call(f"abort request {name}", s.finish_requests, [name], RequestStatus.FINISHED_ABORTED)
    for _ in range(MAX_DRAIN_STEPS):
        if not pair["engine"].has_unfinished_requests():
            break
        one_step(" (running until every request has finished)")
