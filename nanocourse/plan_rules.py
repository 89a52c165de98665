"""The rules a SchedulerOutput keeps, checked where the learner's schedule() hands it over.

A plan that breaks one (a request scheduled twice its need, a newcomer admitted with the wrong cache hit) would
otherwise surface steps later as a bare KeyError from inside update_from_output or the model runner. The graders
of chapters 07, 12 and 13 call checked_schedule() instead of scheduler.schedule(): it runs schedule(), then names
the request and the rule it broke, and the value the plan gave.

    so = checked_schedule(scheduler)          # raises PlanError naming the rule, or returns the plan
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from nanoengine.core.sched.output import PLACEHOLDER_TOKEN_ID


class PlanError(AssertionError):
    """A SchedulerOutput that breaks a rule every plan keeps; the message names the request and the rule, and
    `plan` holds the tokens it scheduled (request id to tokens)."""

    def __init__(self, message: str, plan: dict | None = None) -> None:
        super().__init__(message)
        self.plan = plan or {}


@dataclass(slots=True)
class _Before:
    """A request as the step found it."""

    status: str
    num_computed_tokens: int
    num_tokens: int
    num_tokens_with_spec: int


def snapshot(scheduler: Any) -> dict[str, _Before]:
    """Every live request as it stands before a schedule() call."""
    return {
        rid: _Before(r.status.name, r.num_computed_tokens, r.num_tokens, r.num_tokens_with_spec)
        for rid, r in scheduler.requests.items()
    }


def violation(scheduler: Any, so: Any, before: dict[str, _Before], lookups: dict[str, int] | None = None) -> str | None:
    """The first rule the plan `so` breaks, in words naming the request and the value the plan gave; None if it
    keeps them all. `before`: snapshot() taken just before schedule(); `lookups`: the cache hit (tokens) the
    prefix-cache lookup gave each request during the step, when recorded."""
    config = scheduler.config
    plan = dict(so.num_scheduled_tokens)
    running = {r.request_id for r in scheduler.running}
    admitted = {d.req_id: d for d in so.scheduled_new_reqs}
    for rid, n in plan.items():
        was = before.get(rid)
        if was is None:
            return (
                f"the plan schedules {n!r} tokens for request {rid!r}, which is not a live request (every scheduled "
                f"id is a request in scheduler.requests, running or waiting when the step began)"
            )
        if not isinstance(n, int) or n <= 0:
            return f"the plan schedules {n!r} tokens for request {rid}: a planned request gets at least 1 token"
        if rid not in running:
            return (
                f"request {rid} is scheduled ({n} tokens) but is not in the running list after the step: a planned "
                f"request runs (a newcomer is admitted, a victim leaves the plan)"
            )
        if rid in so.preempted_req_ids:
            return f"request {rid} is both preempted and scheduled ({n} tokens): a victim leaves the plan"
        if was.status == "RUNNING":
            if rid in admitted:
                return f"request {rid} was already running, yet the plan lists it among the newly admitted requests"
            need = was.num_tokens_with_spec - was.num_computed_tokens
            if n > need:
                return (
                    f"running request {rid} is scheduled {n} tokens, but it needs only {need} (num_tokens_with_spec "
                    f"{was.num_tokens_with_spec} - num_computed_tokens {was.num_computed_tokens})"
                )
            if was.num_computed_tokens + n > config.max_model_len - 1:
                return (
                    f"running request {rid} is scheduled {n} tokens from position {was.num_computed_tokens}: its "
                    f"last at position {was.num_computed_tokens + n - 1}, but no position may reach max_model_len "
                    f"- 1 = {config.max_model_len - 1} (at most {config.max_model_len - 1 - was.num_computed_tokens})"
                )
        else:
            new = admitted.get(rid)
            if new is None:
                return (
                    f"request {rid} was waiting and is scheduled ({n} tokens), but the plan does not list it among "
                    f"the newly admitted requests (new_reqs: what admitting it returned)"
                )
            hit = lookups.get(rid) if lookups is not None else None
            if hit is not None and new.num_computed_tokens != hit:
                return (
                    f"request {rid} is admitted with num_computed_tokens {new.num_computed_tokens}, but its "
                    f"prefix-cache hit this step is {hit} tokens: a newcomer starts at its cache hit"
                )
            need = was.num_tokens - new.num_computed_tokens
            padding = so.scheduled_spec_decode_tokens.get(rid, [])
            if need == 1 and padding and all(d == PLACEHOLDER_TOKEN_ID for d in padding):
                need += len(padding)  # padded to 1 + k with placeholder drafts (Scheduler.padded_size)
            if n > need:
                return (
                    f"newly admitted request {rid} is scheduled {n} tokens, but it needs only {need} (its "
                    f"{was.num_tokens} tokens less its {new.num_computed_tokens}-token cache hit"
                    + (
                        f", and {len(padding)} placeholder drafts"
                        if need > was.num_tokens - new.num_computed_tokens
                        else ""
                    )
                    + ")"
                )
    total = sum(n for n in plan.values() if isinstance(n, int))
    if total > config.max_num_batched_tokens:
        return (
            f"the plan schedules {total} tokens in all ({plan}), over the budget max_num_batched_tokens = "
            f"{config.max_num_batched_tokens}"
        )
    if len(running) > config.max_num_seqs:
        return f"{len(running)} requests run after the step, over max_num_seqs = {config.max_num_seqs}"
    return None


def checked_schedule(scheduler: Any, schedule: Callable[[], Any] | None = None, where: str = "") -> Any:
    """scheduler.schedule() (or `schedule`), with its plan checked as it is handed over: raises PlanError naming
    the request and the rule it broke. The KV cache manager's prefix-cache lookups are recorded during the call
    (without changing them), so an admitted request's cache hit is checked against the one it was given."""
    before = snapshot(scheduler)
    kv = scheduler.kv_cache_manager
    lookups: dict[str, int] = {}
    original = getattr(kv, "get_computed_blocks", None)
    spied = False
    if original is not None:

        def spy(request, *args, **kwargs):
            result = original(request, *args, **kwargs)
            lookups[request.request_id] = result[1]
            return result

        try:
            kv.get_computed_blocks = spy
            spied = True
        except AttributeError:  # a manager with __slots__: no hit check
            pass
    try:
        so = (schedule or scheduler.schedule)()
    finally:
        if spied:
            del kv.get_computed_blocks
    broken = violation(scheduler, so, before, lookups if spied else None)
    if broken is not None:
        raise PlanError(
            f"{where}{': ' if where else ''}your schedule() returned a plan that breaks a rule: {broken}",
            dict(so.num_scheduled_tokens),
        )
    return so
