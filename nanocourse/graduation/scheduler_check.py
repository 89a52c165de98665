"""The scheduler checks: nanoengine's Scheduler (the engine's, the worked solution's or the learner's, on the part's
KV cache manager) and vLLM 0.33.0's own Scheduler, side by side through nanocourse/differential.py's
replay_workload on the course's random workloads: chunked prefill, preemption, FCFS and priority, prefix hits,
aborts, sliding-window groups, and n-gram, draft-model or EAGLE drafts. Everything replay_workload observes is compared
after every step; hash values by class (common.ON_PURPOSE).
"""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from nanocourse.differential import (
    MAX_DRAIN_STEPS,
    Story,
    _observe,
    _sampled,
    _shorter,
    replay_workload,
    scheduler_config,
    scheduler_workloads,
)
from nanocourse.graduation.common import (
    BS,
    KNOWN_DIFFERENCES,
    KnownDifference,
    Labels,
    Parts,
    Result,
    cached_blocks,
    has_engine_eagle_search,
    hypothesis_settings,
    kv_cache_groups,
    run_property,
)
from nanocourse.graduation.vllm_side import Vllm, VllmScheduler
from nanoengine.core import get_request_block_hasher
from nanoengine.core.sched.async_scheduler import AsyncScheduler
from nanoengine.core.sched.output import CachedRequestData, SchedulerOutput
from nanoengine.kv_cache_interface import get_kv_cache_groups
from nanoengine.request import Request, RequestStatus
from nanoengine.sampling_params import SamplingParams
from nanoengine.worker.outputs import ModelRunnerOutput

NEW_BLOCKS_FIELD = "the new block ids of the running requests, per KV cache group"
HASH_FIELD = "the blocks the prefix cache names (block id, hash)"


class _Counter:
    def __init__(self) -> None:
        self.operations = 0


class _With:
    """An object as it is, but for the attributes given."""

    def __init__(self, target: Any, **fields: Any) -> None:
        self._target = target
        self.__dict__.update(fields)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._target, name)


def _observer(counter: _Counter) -> Callable[..., dict[str, Any]]:
    """replay_workload's observation, with hashes compared by class and "no new blocks" as None (ON_PURPOSE)."""
    labels = Labels()

    def observe(scheduler: Any, so: Any, finished: Any, spec: bool) -> dict[str, Any]:
        kv = scheduler.kv_cache_manager
        # _observe reads the hashes from the engine's map; they are read here instead, from either side's blocks.
        pool = _With(kv.block_pool, cached_block_hash_to_block={})
        seen = _observe(_With(scheduler, kv_cache_manager=_With(kv, block_pool=pool)), so, finished, spec)
        seen[NEW_BLOCKS_FIELD] = [(r, ids if ids and any(ids) else None) for r, ids in seen[NEW_BLOCKS_FIELD]]
        if spec:
            seen[HASH_FIELD] = [(i, labels(scheduler, h)) for i, h in cached_blocks(kv.block_pool)]
        if isinstance(scheduler, VllmScheduler):
            counter.operations += 1
        return seen

    return observe


# The scheduler checks: (name, extra config strategies, drafter) -------------------------------------------------
SCHEDULER_CHECKS: dict[str, dict[str, Any]] = {
    # The course's pressure workloads use the priority policy only; here FCFS gets them too (its victim is the newest).
    "scheduler": {"policy": st.sampled_from(["fcfs", "priority"])},
    "scheduler, sliding window": {
        "window": st.integers(1, 9),
        "sliding_groups": st.integers(1, 2),
    },
    "scheduler, n-gram drafts": {"num_speculative_tokens": st.sampled_from([1, 2, 4]), "drafter": st.just("ngram")},
    "scheduler, draft-model drafts": {
        "num_speculative_tokens": st.sampled_from([1, 2, 4]),
        "drafter": st.just("draft_model"),
    },
    "scheduler, EAGLE drafts": {"num_speculative_tokens": st.sampled_from([1, 2, 4]), "drafter": st.just("eagle")},
    # The course's workloads as they are: max_model_len 8192 on pools of a few blocks, which vLLM would refuse to
    # start with; a request alone in the pool then outgrows it.
    "scheduler, max_model_len beyond the pool": {"oversized": st.just(True)},
    # A lone request's drafts can outgrow the pool where its own tokens would not: vLLM's preemption drops them and
    # readmits it. Its lookahead slots, asked for again at admission, it keeps.
    "scheduler, max_model_len beyond the pool, draft-model drafts": {
        "oversized": st.just(True),
        "num_speculative_tokens": st.sampled_from([1, 2, 3]),
        "drafter": st.just("draft_model"),
    },
}


def replay(vllm: Vllm, parts: Parts, workload: tuple[dict, list], observe: Callable[..., dict[str, Any]]) -> None:
    """One workload (scheduler_workloads' config and operations) through parts' scheduler and vLLM's, side by side;
    AssertionError with the story at the first difference. Only configurations vLLM accepts (ON_PURPOSE)."""
    cfg, ops = dict(workload[0]), workload[1]
    capped: list[str] = []  # the requests this side ended for outgrowing the pool (max_model_len beyond it only)
    # Of those, the ones it ended while running with no drafts: a preemption drops nothing that would let them fit
    # (lookahead slots are asked for again at admission), so vLLM, which preempts them, never completes them.
    capped_bare: list[str] = []
    # The requests this side left unpadded only for a threshold below 1 + k, which vLLM pads (its own assert).
    padded_below_threshold: list[str] = []
    theirs: list[Any] = []  # vLLM's scheduler, once built
    windows = [cfg["window"]] * cfg["sliding_groups"] + [None] if "window" in cfg else [None]
    k, drafter = cfg.get("num_speculative_tokens", 0), cfg.get("drafter")
    groups, eagle_group_ids = kv_cache_groups(windows, drafter == "eagle")
    num_blocks = cfg["num_blocks"] * len(groups)
    if drafter == "eagle" and not has_engine_eagle_search(parts):
        raise KnownDifference("EAGLE needs the engine's full-attention search")
    if drafter in ("draft_model", "eagle"):
        cfg["num_lookahead_tokens"] = k
        cfg["budget"] = max(cfg["budget"], k + 1)  # vLLM needs a token's slot beyond the lookahead ones
    if drafter == "draft_model":
        cfg["max_num_new_slots_for_drafting"] = 1  # SpeculativeConfig's, for a draft model
    cfg["max_num_seqs"] = min(cfg["max_num_seqs"], cfg["budget"])  # vLLM: at least one token per sequence
    if not cfg.pop("oversized", False):
        windows = [g.sliding_window for g in groups]
        cfg["max_model_len"] = vllm.max_model_len(BS, windows, num_blocks, cfg["budget"])
        ops = [_shorter(op, cfg["max_model_len"] - 1) for op in ops]

    def build(ours: bool) -> Any:
        if not ours:
            theirs[:] = [
                _vllm_scheduler(
                    vllm,
                    cfg,
                    num_blocks,
                    windows=[g.sliding_window for g in groups],
                    eagle_group_ids=eagle_group_ids,
                    num_speculative_tokens=k,
                    drafter=drafter,
                )
            ]
            return theirs[0]
        pool = parts.block_pool_cls(num_blocks, cfg["caching"], BS)
        eagle = {"use_eagle": True} if drafter == "eagle" else {}  # a hit drops its last block (EngineConfig)
        # vLLM's max_in_flight_tokens: one budget, with one batch in flight (vllm_config).
        manager = parts.kv_cache_manager_cls(
            BS,
            pool,
            kv_cache_groups=groups,
            max_model_len=scheduler_config(cfg).max_model_len,
            max_in_flight_tokens=cfg["budget"],
            **parts.manager_kwargs,
            **eagle,
        )
        scheduler = parts.scheduler_cls(scheduler_config(cfg), manager)
        finish_length_capped = scheduler.finish_length_capped

        def record(request: Any) -> None:
            capped.append(request.request_id)
            if request.status.name == "RUNNING" and not request.spec_token_ids:
                capped_bare.append(request.request_id)
            finish_length_capped(request)

        scheduler.finish_length_capped = record
        padded_size = scheduler.padded_size

        def padding(request: Any, num_computed_tokens: int, threshold: int, running_scheduled: Any) -> int:
            running_scheduled = list(running_scheduled)
            size = padded_size(request, num_computed_tokens, threshold, running_scheduled)
            if not size and threshold > 0 and padded_size(request, num_computed_tokens, 0, running_scheduled):
                padded_below_threshold.append(request.request_id)
            return size

        scheduler.padded_size = padding
        return scheduler

    def never_run_again() -> bool:
        """vLLM holds every request this side capped waiting, and either each was capped bare (capped_bare: vLLM
        readmits it and stops at the same point for ever, or never readmits it) or vLLM is stuck: nothing running,
        and a next step that schedules none but those bare ones (which then hold up everything behind them). Called
        at a difference only, when the comparison is over (it steps vLLM's scheduler, which may fail its own assert
        on a padded readmission: that known difference then)."""
        side = theirs[0]
        if not set(capped) <= {r.request_id for r in side.waiting}:
            return False
        if set(capped) <= set(capped_bare):
            return True
        return not side.running and set(side.schedule().original.num_scheduled_tokens) <= set(capped_bare)

    with vllm.modules.active(), _known_differences(capped, never_run_again, padded_below_threshold):
        replay_workload(
            build,
            cfg,
            ops,
            BS,
            f"{num_blocks - 1} usable blocks of {BS} tokens" + (f" in {len(groups)} groups" if len(groups) > 1 else ""),
            reference="vLLM 0.33.0",
            subject=parts.subject,
            observe=observe,
        )


def _vllm_scheduler(vllm: Vllm, cfg: dict, num_blocks: int, **kwargs: Any) -> VllmScheduler:
    """vLLM's Scheduler for a workload's config (scheduler_workloads' keys), on num_blocks blocks."""
    return VllmScheduler(
        vllm,
        num_blocks=num_blocks,
        block_size=BS,
        max_num_batched_tokens=cfg["budget"],
        max_num_seqs=cfg["max_num_seqs"],
        policy=cfg["policy"],
        long_prefill_token_threshold=cfg["threshold"],
        enable_prefix_caching=cfg["caching"],
        max_model_len=scheduler_config(cfg).max_model_len,
        **kwargs,
    )


@contextlib.contextmanager
def _known_differences(
    capped: list[str], never_run_again: Callable[[], bool], padded_below_threshold: list[str]
) -> Iterator[None]:
    """A difference once this side has left a request unpadded that vLLM pads below its threshold is vLLM's own
    assert: vLLM then fails the assert, or leaves the request waiting where the budget cannot hold 1 + k. One once
    this side has ended requests for outgrowing the pool is that known difference only if vLLM would never run
    them again; one that vLLM readmits (it preempted itself to drop its drafts) is a real difference."""
    try:
        yield
    except AssertionError as error:
        if padded_below_threshold:
            raise KnownDifference("vLLM's own assert") from error
        if capped and never_run_again():
            raise KnownDifference("a lone request outgrew the pool") from error
        raise


def check_scheduler(vllm: Vllm, parts: Parts, name: str, max_examples: int) -> Result:
    """Random workloads through parts.scheduler_cls (on parts' KV cache manager) and vLLM's Scheduler, compared
    after every step: plans, preemptions, admissions with their hits, new block ids, finishes, the running list
    and waiting queue, every request's blocks, the free queue and the prefix-cache stats (with drafts also the
    drafts verified, every num_computed_tokens and the cached blocks' hashes)."""
    result, counter = Result(name), _Counter()

    @hypothesis_settings(max_examples)
    @given(workload=scheduler_workloads(**SCHEDULER_CHECKS[name]))
    def property_(workload: tuple[dict, list]) -> None:
        result.examples, result.example = result.examples + 1, {"workload": workload}
        try:
            # A fresh observer a workload: its hash names must not outlive the schedulers they were given for.
            replay(vllm, parts, workload, _observer(counter))
        except KnownDifference as known:  # reported by name (run.report), never compared past
            result.count_known(known.case, workload)

    run_property(result, property_, vllm, parts.subject)
    result.operations = counter.operations
    return result


def _case(cfg: dict, *ops: tuple) -> tuple[dict, list]:
    base = {"policy": "fcfs", "caching": False, "threshold": 0, "max_num_seqs": 1}
    return {**base, **cfg}, list(ops)


# The shortest workloads the checks found where nanoengine and vLLM 0.33.0 part (issue 44's classes with drafts,
# and four with sliding windows), replayed by `--known` so a fix can be seen to take: each says whether it still
# diverges, or reaches one of KNOWN_DIFFERENCES. A request is ("add", prompt tokens, prefix family, priority,
# max_tokens, prompt_logprobs).
KNOWN_CASES = {
    "drafts: verified blocks cached late (update_from_output)": _case(
        {
            "num_blocks": 4,
            "budget": 2,
            "policy": "priority",
            "caching": True,
            "max_num_seqs": 3,
            "num_speculative_tokens": 1,
            "drafter": "ngram",
        },
        ("add", 1, 0, 3, 20, False),
        ("step", 1),
        ("add", 1, 0, 0, 4, False),
        ("add", 1, 0, 0, 4, False),
        ("step", 1),
    ),
    "drafts: the input budget reserves a draft model's slots": _case(
        {"num_blocks": 3, "budget": 2, "num_speculative_tokens": 1, "drafter": "draft_model"},
        ("add", 1, 0, 0, 2, False),
    ),
    "drafts: a new one-token request is padded to 1 + k": _case(
        {"num_blocks": 12, "budget": 16, "max_num_seqs": 4, "num_speculative_tokens": 2, "drafter": "ngram"},
        ("add", 5, 0, 0, 6, False),
        ("step", 1),
        ("add", 1, 1, 0, 6, False),
        ("step", 3),
    ),
    "max_model_len beyond the pool: a lone request outgrowing it is capped, where vLLM preempts it": _case(
        {"num_blocks": 3, "budget": 1, "oversized": True}, ("add", 1, 0, 0, 9, False)
    ),
    # a alone outgrows the pool only with its draft: vLLM preempts it, which drops the draft, and b and c (higher
    # priority) run; nanoengine used to end a.
    "drafts: a lone request whose drafts outgrow the pool preempts itself": _case(
        {
            "num_blocks": 4,
            "budget": 2,
            "policy": "priority",
            "max_num_seqs": 2,
            "num_speculative_tokens": 1,
            "drafter": "draft_model",
            "oversized": True,
        },
        ("add", 1, 0, 3, 20, False),
        ("step", 1),
        ("add", 1, 0, 0, 4, False),
        ("add", 1, 0, 0, 4, False),
    ),
    "drafts: a threshold below 1 + k cuts a padded request (vLLM's own assert)": _case(
        {
            "num_blocks": 12,
            "budget": 16,
            "max_num_seqs": 4,
            "threshold": 2,
            "num_speculative_tokens": 2,
            "drafter": "ngram",
        },
        ("add", 1, 0, 0, 6, False),
        ("step", 1),
        ("add", 1, 1, 0, 6, False),
        ("step", 1),
    ),
    "drafts: a threshold below 1 + k pads a readmission the budget cannot hold (vLLM's own assert)": _case(
        {
            "num_blocks": 5,
            "budget": 4,
            "caching": True,
            "threshold": 3,
            "num_speculative_tokens": 3,
            "drafter": "draft_model",
            "oversized": True,
        },
        ("add", 11, 0, 0, 3, False),
        ("add", 1, 0, 0, 1, False),
    ),
    "drafts: proposed after a prefill chunk, they are dropped": _case(
        {"num_blocks": 3, "budget": 3, "num_speculative_tokens": 1, "drafter": "ngram"}, ("add", 4, 0, 0, 1, False)
    ),
    "sliding window: blocks no hit can reach are not cached": _case(
        {"num_blocks": 3, "budget": 1, "caching": True, "window": 1, "sliding_groups": 1}, ("add", 1, 0, 0, 4, False)
    ),
    "sliding window: admission caps a sliding group's blocks": _case(
        {"num_blocks": 3, "budget": 1, "window": 1, "sliding_groups": 1}, ("add", 9, 0, 0, 1, False)
    ),
    # Retention 0, vLLM 0.33's default: of a's sliding blocks only block 1 (before token 8, where a resend of its
    # prompt hits) is cached, so b's hit is 8 tokens, not 12.
    "sliding window: only the blocks a later hit can reach are cached": _case(
        {"num_blocks": 8, "budget": 16, "caching": True, "window": 4, "sliding_groups": 1},
        ("add", 12, 0, 0, 1, False),
        ("step", 2),
        ("add", 16, 0, 0, 1, False),
    ),
    # b's full-attention hit (12) outruns its sliding one (8): the junction at 12 makes b cache sliding block 2, so
    # c hits 12 tokens, not 8.
    "sliding window: a shared prefix's junction is cached": _case(
        {"num_blocks": 12, "budget": 32, "caching": True, "window": 4, "sliding_groups": 1},
        ("add", 12, 0, 0, 1, False),
        ("step", 2),
        ("add", 20, 0, 0, 1, False),
        ("step", 2),
        ("add", 16, 0, 0, 1, False),
    ),
}


KNOWN_PREFIX = "a known difference, reported by name: "


def verdict(story: str | None) -> str:
    """A known case's replay (replay_known's value) in two words."""
    if story is None:
        return "agrees now"
    return "known" if story.startswith(KNOWN_PREFIX) else "still diverges"


def replay_known(vllm: Vllm, parts: Parts) -> dict[str, str | None]:
    """Each of KNOWN_CASES replayed: the story of its first difference, KNOWN_PREFIX and the case where it reaches
    one of KNOWN_DIFFERENCES, or None where the sides now agree."""
    found: dict[str, str | None] = {}
    for name, workload in KNOWN_CASES.items():
        try:
            replay(vllm, parts, workload, _observer(_Counter()))
            found[name] = None
        except KnownDifference as known:
            found[name] = f"{KNOWN_PREFIX}{known.case} ({KNOWN_DIFFERENCES[known.case]})"
        except AssertionError as error:
            found[name] = str(error)
    return found


# Async scheduling: vLLM's AsyncScheduler beside nanoengine's, driven as vLLM's engine core drives them ------------
# Full attention only: with sliding windows the synchronous check already parts from vLLM (KNOWN_CASES' two sliding
# classes), so an async check there would find those first.
ASYNC_SCHEDULER_CHECKS: dict[str, dict[str, Any]] = {
    "async scheduler": {"policy": st.sampled_from(["fcfs", "priority"])},
}
ASYNC_FIELD = "each request's counters (computed, output placeholders, in flight, stale, output tokens)"


class _BatchQueue:
    """vLLM's EngineCore.step_with_batch_queue with max_concurrent_batches 2 over one scheduler and a model that
    samples _sampled's token: each step schedules a batch (which requests will sample is known then, from
    is_prefill_chunk); the oldest batch's output is taken only once two are in flight or nothing is left to
    schedule, so step N + 1 is planned before step N's tokens are in."""

    def __init__(self, scheduler: Any) -> None:
        self.scheduler = scheduler
        self.batches: deque[tuple[Any, list[str]]] = deque()

    def busy(self) -> bool:
        return self.scheduler.has_unfinished_requests() or bool(self.batches)

    def step(self) -> tuple[Any, list[Any]]:
        """(the batch scheduled, or None; the requests the output taken finished, if one was taken)."""
        s, so = self.scheduler, None
        if s.has_unfinished_requests():
            so = s.schedule()
            sampling = [r for r in so.num_scheduled_tokens if not s.requests[r].is_prefill_chunk]
            self.batches.appendleft((so, sampling))
            if len(self.batches) < 2 and (so.total_num_scheduled_tokens > 0 or s.has_unfinished_requests()):
                return so, []
        if not self.batches:
            return so, []
        taken, sampling = self.batches.pop()
        # A request finished meanwhile gets its token too, and the scheduler drops it, as vLLM's runner and
        # scheduler do; one preempted meanwhile gets the token at its position (stale output).
        reqs = s.requests
        output = ModelRunnerOutput({r: [_sampled(r, reqs[r].num_tokens) if r in reqs else 0] for r in sampling})
        return so, s.update_from_output(taken, output)


def _async_observer(counter: _Counter) -> Callable[..., dict[str, Any]]:
    """_observer's fields of the batch just scheduled (none: an empty plan) and the requests finished, and every
    request's async counters."""
    observe = _observer(counter)
    empty = SchedulerOutput([], CachedRequestData(), {}, 0, set(), set())

    def seen(scheduler: Any, so: Any, finished: list[Any]) -> dict[str, Any]:
        fields = observe(scheduler, so if so is not None else empty, finished, False)
        fields[ASYNC_FIELD] = {
            r: (
                q.num_computed_tokens,
                q.num_output_placeholders,
                q.num_in_flight_tokens,
                q.num_stale_output_tokens,
                len(q.output_token_ids),
            )
            for r, q in sorted(scheduler.requests.items())
        }
        return fields

    return seen


def replay_async(
    vllm: Vllm,
    parts: Parts,
    workload: tuple[dict, list],
    observe: Callable[..., dict[str, Any]],
    scheduler_cls: type[AsyncScheduler] = AsyncScheduler,
) -> None:
    """One workload through scheduler_cls (nanoengine's AsyncScheduler, on parts' KV cache manager) and vLLM's
    AsyncScheduler, each behind its own _BatchQueue, compared after every engine step; aborts come between steps,
    while batches are in flight."""
    cfg, ops = dict(workload[0]), workload[1]
    groups = get_kv_cache_groups([None])
    num_blocks = cfg["num_blocks"]
    cfg["max_num_seqs"] = min(cfg["max_num_seqs"], cfg["budget"])  # vLLM: at least one token per sequence
    cfg["max_model_len"] = vllm.max_model_len(BS, [None], num_blocks, cfg["budget"])
    ops = [_shorter(op, cfg["max_model_len"] - 1) for op in ops]
    story = Story(f"{num_blocks - 1} usable blocks of {BS} tokens, {cfg}", "vLLM 0.33.0's", parts.subject)
    hasher, names = get_request_block_hasher(BS), []

    def engine_step(why: str = "") -> None:
        seen = {who: observe(q.scheduler, *q.step()) for who, q in sides.items()}
        plan = seen["vllm"]["the tokens scheduled, in order (request, tokens)"]
        story.add(f"engine step{why}: vLLM schedules {plan or 'nothing'}")
        story.compare(seen["ours"], seen["vllm"])

    with vllm.modules.active():
        pool = parts.block_pool_cls(num_blocks, cfg["caching"], BS)
        manager = parts.kv_cache_manager_cls(BS, pool, kv_cache_groups=groups, **parts.manager_kwargs)
        sides = {
            "ours": _BatchQueue(scheduler_cls(scheduler_config(cfg), manager)),
            "vllm": _BatchQueue(_vllm_scheduler(vllm, cfg, num_blocks, async_scheduling=True)),
        }
        for op in ops:
            if op[0] == "add":
                _, length, family, priority, max_tokens, _ = op
                name = "abcdefghijklmnopqrstuvwxyz"[len(names)]
                names.append(name)
                story.add(f"add request {name}: {length} prompt tokens (family {family}), max_tokens {max_tokens}")
                for q in sides.values():
                    q.scheduler.add_request(
                        Request(
                            name,
                            [1000 * family + j for j in range(length)],
                            priority=priority,
                            arrival_time=float(len(names)),
                            block_hasher=hasher,
                            sampling_params=SamplingParams(max_tokens=max_tokens, ignore_eos=True),
                        )
                    )
            elif op[0] == "step":
                for _ in range(op[1]):
                    engine_step()
            elif names:
                name = names[op[1] % len(names)]
                story.add(f"abort request {name}")
                for q in sides.values():
                    q.scheduler.finish_requests([name], RequestStatus.FINISHED_ABORTED)
        for _ in range(MAX_DRAIN_STEPS):
            if not sides["vllm"].busy():
                break
            engine_step(" (until every request has finished)")
        assert not sides["ours"].busy(), "nanoengine's side has work left where vLLM's has none"


def check_async_scheduler(
    vllm: Vllm, parts: Parts, name: str, max_examples: int, scheduler_cls: type[AsyncScheduler] = AsyncScheduler
) -> Result:
    """Random workloads (ASYNC_SCHEDULER_CHECKS[name]) through scheduler_cls and vLLM's AsyncScheduler, both driven
    by a batch queue of two: after every engine step, check_scheduler's fields (no drafts) and every request's
    computed tokens, output placeholders, tokens in flight, stale output tokens and output tokens."""
    result, counter = Result(name), _Counter()
    observe = _async_observer(counter)

    @hypothesis_settings(max_examples)
    @given(workload=scheduler_workloads(**ASYNC_SCHEDULER_CHECKS[name]))
    def property_(workload: tuple[dict, list]) -> None:
        result.examples, result.example = result.examples + 1, {"workload": workload}
        replay_async(vllm, parts, workload, observe, scheduler_cls)

    run_property(result, property_, vllm, parts.subject)
    result.operations = counter.operations
    return result
