"""The scheduler: which requests run this step, and how many tokens each (vllm/v1/core/sched/scheduler.py).

There is no prefill phase and no decode phase. Every request has `num_computed_tokens` and
`num_tokens`; a step gives each request some tokens so the first catches up with the second, all
from one token budget. A 500-token prompt and a one-token decode can share a step; a long prompt
is split into chunks over several steps (chunked prefill).

Speculative decoding adds draft tokens (Request.spec_token_ids, proposed after each step): a running request
is scheduled num_tokens_with_spec - num_computed_tokens tokens, its last verified token and its drafts, from
the same budget. A drafter that reads more input than the target was scheduled (a draft model reads the sampled
token too) has each scheduled request reserve config.max_num_new_slots_for_drafting more of the budget (vLLM's
input_budget). A request admitted with one token left beside running decodes is padded to 1 + k tokens with
placeholder drafts (padded_size), so that the step stays a uniform decode batch. allocate_slots gets them all as
new tokens, plus config.num_lookahead_tokens slots past them (vLLM's num_lookahead_tokens): k for a draft model or
an EAGLE head, which write their own KV for the drafts they feed themselves after the step, and 0 for n-gram
drafts, which write none. Lookahead stops at max_model_len, as in vLLM's
allocate_slots. allocate_slots caches blocks only up to request.num_tokens, so no block holding an unverified
token is ever cached.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Self

from nanoengine.config.scheduler import SchedulerConfig
from nanoengine.core import BlockPool, BlockPoolInterface, FreeKVCacheBlockQueue, KVCacheManagerInterface
from nanoengine.core.sched.output import PLACEHOLDER_TOKEN_ID, CachedRequestData, NewRequestData, SchedulerOutput
from nanoengine.core.sched.request_queue import RequestQueue, SchedulingPolicy, create_request_queue
from nanoengine.kv_cache_interface import KVCacheConfig
from nanoengine.parts import build_part, check_pool_names_groups
from nanoengine.request import Request, RequestStatus
from nanoengine.worker.outputs import ModelRunnerOutput

if TYPE_CHECKING:
    from nanoengine.config.engine import EngineConfig

__all__ = ["Scheduler", "SchedulerConfig"]


class Scheduler:
    """Invariants: every running request holds KV blocks for its computed tokens; a waiting request
    holds none (preemption frees everything and recomputes, as vLLM v1 does); a finished request is
    freed at once and reported to the runner in the next SchedulerOutput.

    schedule() is built from small public steps (choose_victim, preempt, admit, finish_length_capped,
    make_output) that a scheduler of one's own reuses while writing the policy itself.
    """

    def __init__(self, config: SchedulerConfig, kv_cache_manager: KVCacheManagerInterface) -> None:
        self.config = config
        self.policy = SchedulingPolicy(config.policy)
        self.kv_cache_manager = kv_cache_manager
        self.block_size = kv_cache_manager.block_size
        self.requests: dict[str, Request] = {}
        self.waiting: RequestQueue = create_request_queue(self.policy)
        self.running: list[Request] = []
        self.finished_req_ids: set[str] = set()
        self._capped: list[Request] = []  # finished inside schedule(); reported by update_from_output
        self.num_preemptions = 0

    @classmethod
    def from_config(cls, config: EngineConfig, kv_cache_config: KVCacheConfig) -> Self:
        """A scheduler for the engine `config` describes, over a KV cache of kv_cache_config's blocks and groups:
        it builds its KV cache manager (and the manager's pool) from the cache settings and the engine's parts,
        as vLLM's Scheduler.__init__ builds its KVCacheManager, then itself as cls(scheduler_config, manager)."""
        parts, cache = config.parts, config.cache_config
        groups = kv_cache_config.kv_cache_groups
        if parts.block_pool is None:
            pool = BlockPool(
                kv_cache_config.num_blocks,
                cache.enable_prefix_caching,
                hash_block_size=cache.block_size,
                free_queue_cls=parts.free_queue_cls or FreeKVCacheBlockQueue,
            )
        else:
            # A factory of two arguments (another eviction policy's) still works when no queue is given.
            pool = build_part(
                "block_pool",
                parts.block_pool,
                BlockPoolInterface,
                "(num_blocks, enable_caching)",
                kv_cache_config.num_blocks,
                cache.enable_prefix_caching,
                **({"free_queue_cls": parts.free_queue_cls} if parts.free_queue_cls else {}),
            )
            if len(groups) > 1:
                check_pool_names_groups(pool)
        manager = build_part(
            parts.named("kv_cache_manager_cls"),
            parts.kv_cache_manager_cls,
            KVCacheManagerInterface,
            "(block_size, block_pool, kv_cache_groups=..., ...)",
            cache.block_size,
            pool,
            kv_cache_groups=groups,
            full_attention_manager_cls=parts.full_attention_manager_cls,
            sliding_window_manager_cls=parts.sliding_window_manager_cls,
            # A sliding group's admission cap: vLLM's max_in_flight_tokens, one budget per batch not yet settled
            # (VllmConfig.max_concurrent_batches: two under async scheduling).
            max_model_len=config.scheduler_config.max_model_len,
            max_in_flight_tokens=(1 + config.scheduler_config.async_scheduling)
            * config.scheduler_config.max_num_batched_tokens,
            **({"use_eagle": True} if config.use_eagle else {}),
        )
        return cls(config.scheduler_config, manager)

    def add_request(self, request: Request) -> None:
        self.requests[request.request_id] = request
        request.status = RequestStatus.WAITING
        self.waiting.add_request(request)

    def has_unfinished_requests(self) -> bool:
        return bool(self.waiting or self.running)

    # ---- scheduling -------------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        # vLLM's input_budget. vLLM also keeps a token_budget, of max_num_scheduled_tokens (max_num_batched_tokens
        # unless set apart); both lose each step's tokens and the input budget the drafting slots too, so with
        # nanoengine's one setting the input budget is always the tighter.
        budget = self.config.max_num_batched_tokens
        slots = self.config.max_num_new_slots_for_drafting
        threshold = self.long_prefill_threshold()
        num_scheduled: dict[str, int] = {}
        new_blocks: dict[str, tuple[list[int], ...]] = {}
        preempted: list[Request] = []
        kv = self.kv_cache_manager

        # Running requests first: they already hold blocks, and stalling them wastes those blocks.
        i = 0
        while i < len(self.running) and budget > slots:
            request = self.running[i]
            if (
                request.num_output_placeholders > 0
                and request.num_computed_tokens + 2 - request.num_output_placeholders
                >= request.num_prompt_tokens + request.sampling_params.max_tokens
            ):
                # Async scheduling: the step in flight already reaches max_tokens, so another would only be
                # thrown away (vLLM 0.33's schedule(); the + 2 - placeholders discounts drafts still in flight).
                i += 1
                continue
            # Drafts count inside the budget, and no position may reach max_model_len - 1 (vLLM's schedule();
            # without drafts or placeholders the cap never binds, as a running request has num_tokens <
            # max_model_len). Placeholders count as tokens: the token they stand for is the next step's input.
            n = min(
                self.chunk_size(
                    request.num_tokens_with_spec + request.num_output_placeholders - request.num_computed_tokens,
                    budget - slots,
                    threshold,
                ),
                self.config.max_model_len - request.num_computed_tokens - 1,
            )
            if n <= 0:  # async scheduling: the step in flight already reaches max_model_len
                i += 1
                continue
            while (blocks := kv.allocate_slots(request, n, num_lookahead_tokens=self.lookahead(request, n))) is None:
                if len(self.running) == 1 and not request.spec_token_ids:
                    # Alone, out of blocks, and no drafts for a preemption to drop: the request has outgrown the whole
                    # pool (lookahead slots are asked for again at admission, so dropping nothing, a preemption would
                    # only repeat this step for ever). With drafts it preempts itself below, as in vLLM 0.33, and
                    # comes back without them, one token further each time (or, if it cannot be admitted, admission
                    # ends it).
                    self.finish_length_capped(request)
                    break
                victim = self.choose_victim()
                if victim.request_id in num_scheduled:  # already scheduled earlier in this step
                    budget += num_scheduled.pop(victim.request_id) + slots
                    new_blocks.pop(victim.request_id)
                    i -= 1
                self.preempt(victim)
                preempted.append(victim)
                if victim is request:
                    break
            if blocks is None:
                if self.policy is SchedulingPolicy.PRIORITY and request.status is RequestStatus.PREEMPTED:
                    # It was the worst running request and preempted itself: the requests after it rank
                    # higher and may still fit in the blocks it just freed (vLLM 0.33 goes on too).
                    continue
                break
            num_scheduled[request.request_id] = n
            new_blocks[request.request_id] = blocks.get_block_ids()
            budget -= n + slots
            i += 1

        new_reqs: list[NewRequestData] = []
        running_scheduled = list(num_scheduled)
        skipped: list[Request] = []
        # Admit waiting requests only in a step without preemption, or they would just evict each other.
        while not preempted and self.waiting and budget > slots and len(self.running) < self.config.max_num_seqs:
            request = self.waiting.peek_request()
            if request.num_stale_output_tokens:
                # Async scheduling: a preempted request's output is still in flight, and resuming it now would
                # compute again the position that output brings; it waits aside until it drains (vLLM 0.33). The
                # engine's queue of two takes that output before the next schedule(), so this guards deeper queues
                # (vLLM's pipeline parallelism) and drivers of the scheduler other than the engine.
                skipped.append(self.waiting.pop_request())
                continue
            computed_blocks, num_computed = kv.get_computed_blocks(request, record_stats=False)
            n = self.chunk_size(request.num_tokens - num_computed, budget - slots, threshold)
            padded = self.padded_size(request, num_computed, threshold, running_scheduled)
            if padded:
                if padded > budget - slots:
                    break  # vLLM would rather not schedule it than schedule it unpadded
                n = padded
            # Admit only what can hold its whole sequence: a prompt that fits just its first chunk would
            # be preempted mid-prefill and readmitted over and over (the thrashing vLLM users reported).
            lookahead = self.lookahead(request, n, num_computed)
            if (
                kv.allocate_slots(
                    request,
                    n,
                    num_computed,
                    computed_blocks,
                    num_lookahead_tokens=lookahead,
                    full_sequence_must_fit=True,
                )
                is None
            ):
                if not self.running:
                    # The whole pool was there for it: it can never run (a lone request preempted to drop its
                    # drafts whose own tokens and lookahead slots still do not fit). vLLM 0.33 would leave it waiting.
                    self.finish_length_capped(request)
                    continue
                break
            new_reqs.append(self.admit(request, num_computed))
            if padded:
                request.spec_token_ids = [PLACEHOLDER_TOKEN_ID] * self.config.num_spec_tokens
            num_scheduled[request.request_id] = n
            budget -= n + slots
        for request in reversed(skipped):  # back at the front, in their order
            self.waiting.prepend_request(request)
        return self.make_output(num_scheduled, new_blocks, new_reqs, preempted)

    def padded_size(
        self, request: Request, num_computed_tokens: int, threshold: int, running_scheduled: Iterable[str]
    ) -> int:
        """The tokens a waiting request about to be admitted is padded to (0: none): 1 + k, its last token and k
        placeholder drafts (PLACEHOLDER_TOKEN_ID, which no verify step accepts), so that with the running requests
        it makes a uniform decode batch, which vLLM 0.33 keeps for its full CUDA graphs (scheduler.py's
        pad_spec_decode, whatever the graph settings). It is padded when drafts are on, one of its tokens is left
        to compute, running requests were scheduled this step (running_scheduled, their ids) and none of them is
        mid-prompt, or else part of it is computed (a prefix hit), and the padded step and its sampled token fit
        max_model_len. Invariant: a padded request is scheduled 1 + k tokens or not at all.
        vLLM 0.33 pads where long_prefill_token_threshold < 1 + k too, then cuts the padded request to the
        threshold and fails its own `assert num_new_tokens == 1 + self.num_spec_tokens`; nanoengine leaves such a
        request unpadded, as the open upstream fix does (vllm-project/vllm#54028) and as vLLM itself drops the
        padding that a Mamba alignment would cut."""
        size = 1 + self.config.num_spec_tokens
        running_scheduled = list(running_scheduled)
        if (
            size > 1
            and request.num_tokens - num_computed_tokens == 1
            and (running_scheduled or num_computed_tokens > 0)
            and not any(self.requests[r].is_prefill_chunk for r in running_scheduled)
            and num_computed_tokens + size + 1 <= self.config.max_model_len
            and not 0 < threshold < size
        ):
            return size
        return 0

    def long_prefill_threshold(self) -> int:
        """This step's cap on one request's chunk (0: none). The threshold keeps a long prompt from starving
        the others of the budget, so with one request running or waiting there is nobody to starve and no
        cap; the adaptive option floors it at a fair share of the budget (vLLM 0.33's schedule())."""
        num_eligible = len(self.running) + len(self.waiting)
        threshold = self.config.long_prefill_token_threshold if num_eligible > 1 else 0
        if threshold and self.config.long_prefill_token_threshold_adaptive:
            threshold = max(threshold, self.config.max_num_batched_tokens // num_eligible)
        return threshold

    @staticmethod
    def chunk_size(num_needed: int, budget: int, threshold: int) -> int:
        """The tokens a request may take now: its need, capped by the threshold (when set) and the budget."""
        if 0 < threshold < num_needed:
            num_needed = threshold
        return min(num_needed, budget)

    def choose_victim(self) -> Request:
        """Take the request to preempt out of `running`: under FCFS the newest (the list's tail), under
        priority the worst (largest priority value, then latest arrival). vLLM keeps this one policy
        branch inline in schedule()."""
        if self.policy is SchedulingPolicy.PRIORITY:
            victim = max(self.running, key=lambda r: (r.priority, r.arrival_time))
            self.running.remove(victim)
            return victim
        return self.running.pop()

    # ---- steps a scheduler reuses -------------------------------------------------------------
    def preempt(self, request: Request) -> None:
        """Recompute-style preemption of a request already taken out of `running`: free every block
        and put it back at the front of the waiting queue (its place, under priority). Output still in flight
        (async scheduling) becomes stale: it is appended when it comes, without touching the reset counters."""
        self.kv_cache_manager.free(request)
        request.num_computed_tokens = 0
        request.spec_token_ids = []
        request.num_stale_output_tokens = request.num_in_flight_tokens
        request.num_output_placeholders = 0
        request.num_preemptions += 1
        request.status = RequestStatus.PREEMPTED
        self.num_preemptions += 1
        self.waiting.prepend_request(request)

    def lookahead(self, request: Request, num_new_tokens: int, num_computed_tokens: int | None = None) -> int:
        """The lookahead slots to reserve past a request's num_new_tokens: the config's, cut at max_model_len."""
        end = (request.num_computed_tokens if num_computed_tokens is None else num_computed_tokens) + num_new_tokens
        return max(0, min(self.config.num_lookahead_tokens, self.config.max_model_len - end))

    def admit(self, request: Request, num_computed_tokens: int) -> NewRequestData:
        """Move the waiting queue's head, whose slots allocate_slots has just granted, to `running`:
        count its prefix-cache lookup once, here, and describe it for the model runner."""
        if self.waiting.peek_request() is not request:
            raise ValueError(f"admit: request {request.request_id!r} is not at the head of the waiting queue.")
        self.waiting.pop_request()
        self.kv_cache_manager.record_prefix_cache_stats(request, num_computed_tokens)
        self.running.append(request)
        request.status = RequestStatus.RUNNING
        request.num_computed_tokens = num_computed_tokens
        if request.num_cached_tokens < 0:
            request.num_cached_tokens = num_computed_tokens
        return NewRequestData.from_request(request, self.kv_cache_manager.get_block_ids(request.request_id))

    def finish_length_capped(self, request: Request) -> None:
        """End a request that cannot grow (the whole pool is too small for it): running alone with nothing a
        preemption would drop, or waiting with nothing running; it is reported as finished by the next
        update_from_output.

        That happens only where the pool holds fewer tokens than max_model_len, a configuration vLLM 0.33 refuses
        to start with (kv_cache_planning.check_enough_kv_cache_memory: "To serve at least one request with the
        model's max seq len ..."). nanoengine accepts it, since small pools (a few blocks, far under the model's
        max_model_len) are how its scheduler is shown at work, and ends the request here: vLLM's scheduler, given
        such a pool, would preempt the request, which then never fits again and waits for ever."""
        self._finish(request, RequestStatus.FINISHED_LENGTH_CAPPED)
        self._capped.append(request)

    def make_output(
        self,
        num_scheduled: dict[str, int],
        new_blocks: dict[str, tuple[list[int], ...]],
        new_reqs: list[NewRequestData],
        preempted: list[Request],
    ) -> SchedulerOutput:
        """Package the step for the model runner and advance each scheduled request's
        num_computed_tokens, so the next schedule() sees these tokens as computed.

        num_scheduled: tokens per request id this step (running and admitted); new_blocks: the block
        ids allocate_slots returned for each running one; new_reqs: what admit() returned. A request's
        tokens past its num_tokens are its drafts, cut to fit (vLLM's "scheduled_spec_decode_tokens"); a
        scheduled request's drafts are used up either way, and the engine proposes new ones after the step.
        """
        cached = CachedRequestData()
        admitted = {d.req_id for d in new_reqs}
        for req_id in num_scheduled:
            if req_id not in admitted:
                cached.req_ids.append(req_id)
                cached.new_block_ids.append(new_blocks[req_id])
                cached.num_computed_tokens.append(self.requests[req_id].num_computed_tokens)
        out = SchedulerOutput(
            scheduled_new_reqs=new_reqs,
            scheduled_cached_reqs=cached,
            num_scheduled_tokens=num_scheduled,
            total_num_scheduled_tokens=sum(num_scheduled.values()),
            preempted_req_ids={r.request_id for r in preempted},
            finished_req_ids=self.finished_req_ids,
            scheduled_spec_decode_tokens=self.scheduled_spec_decode_tokens(num_scheduled),
        )
        self._update_after_schedule(out)
        return out

    def _update_after_schedule(self, scheduler_output: SchedulerOutput) -> None:
        """Advance each scheduled request's num_computed_tokens (and its tokens in flight) by its scheduled
        tokens, so the next schedule() sees them as computed; the AsyncScheduler adds placeholders here (vLLM
        0.33's method of this name)."""
        self.finished_req_ids = set()
        for req_id, n in scheduler_output.num_scheduled_tokens.items():
            request = self.requests[req_id]
            request.num_computed_tokens += n
            request.num_in_flight_tokens += n
            request.is_prefill_chunk = (
                request.num_computed_tokens < request.num_tokens + request.num_output_placeholders
            )

    def scheduled_spec_decode_tokens(self, num_scheduled: dict[str, int]) -> dict[str, list[int]]:
        """The drafts each request verifies this step: those of its scheduled tokens past its num_tokens (its
        drafts, cut to fit the budget and max_model_len); every scheduled request's drafts are used up, so a
        step never verifies drafts it did not schedule, and the engine proposes anew after the step (the "Speculative
        decode related" lines of vLLM 0.33's Scheduler.schedule). Called before num_computed_tokens advances."""
        drafts = {}
        for req_id, n in num_scheduled.items():
            request = self.requests[req_id]
            num_spec = request.num_computed_tokens + n - request.num_tokens
            if request.spec_token_ids and num_spec > 0:
                drafts[req_id] = request.spec_token_ids[:num_spec]
            request.spec_token_ids = []
        return drafts

    def update_draft_token_ids(self, draft_token_ids: dict[str, list[int]]) -> None:
        """Give running requests the drafts their next step verifies (vLLM's method of this name). Requests
        finished or preempted meanwhile are skipped, and so are the drafts of a request whose last step was a
        prompt chunk: they were proposed from a context that is not the request's yet."""
        for req_id, drafts in draft_token_ids.items():
            request = self.requests.get(req_id)
            if request is not None and request.status is RequestStatus.RUNNING:
                request.spec_token_ids = [] if request.is_prefill_chunk else drafts

    # ---- results ----------------------------------------------------------------------------
    def update_from_output(
        self, scheduler_output: SchedulerOutput, model_runner_output: ModelRunnerOutput
    ) -> list[Request]:
        """Append each request's sampled tokens (none for a prompt chunk that is not the last; after drafts,
        the accepted ones and one more); finish and free the requests that hit EOS, max_tokens or max_model_len.

        Rejected drafts roll num_computed_tokens back (vLLM 0.33's update_from_output, "num_rejected"): their
        KV slots hold tokens that are not the request's, and the next step simply overwrites them.
        """
        finished, self._capped = self._capped, []
        for req_id, num_scheduled in scheduler_output.num_scheduled_tokens.items():
            request = self.requests.get(req_id)
            is_stale = False
            if request is not None:
                request.num_in_flight_tokens -= num_scheduled
                if request.num_stale_output_tokens > 0:  # preempted since this step was scheduled
                    is_stale = True
                    request.num_stale_output_tokens -= num_scheduled
            # A finished request (aborted or stopped while the step ran, under async scheduling) takes nothing,
            # and neither does a prompt chunk that is not the last.
            new_token_ids = model_runner_output.sampled_token_ids.get(req_id)
            if request is None or not new_token_ids:
                continue
            was_running = request.status is RequestStatus.RUNNING
            had_placeholders = request.num_output_placeholders > 0
            drafts = scheduler_output.scheduled_spec_decode_tokens.get(req_id, [])
            if is_stale:  # async scheduling only; an override taking the three arguments never sees it
                status = self.update_request_with_output(request, new_token_ids, drafts, is_stale=True)
            else:
                status = self.update_request_with_output(request, new_token_ids, drafts)
            if not is_stale and was_running and (had_placeholders or self.config.num_spec_tokens):
                # The accepted drafts' blocks are verified now: name them before a stop frees the request
                # (vLLM 0.33 does so here; allocate_slots would only at the request's next step). Async
                # scheduling names only blocks behind the processed tokens: the rest are still in flight.
                self.kv_cache_manager.cache_blocks(request, request.num_computed_tokens - request.num_in_flight_tokens)
            if status is not None:
                self._finish(request, status)
                finished.append(request)
        return finished

    def update_request_with_output(
        self, request: Request, new_token_ids: list[int], spec_token_ids: list[int], is_stale: bool = False
    ) -> RequestStatus | None:
        """A request's tokens from one step (the accepted drafts and one token more, after a verify step of
        spec_token_ids): roll the rejected drafts back from num_computed_tokens, then append the tokens one at
        a time, checking the stop conditions after each; at a stop the rest are dropped. Afterwards
        num_computed_tokens covers every appended token but the last, whose KV the next step computes (vLLM
        0.33: the num_rejected lines of update_from_output, then _update_request_with_output).

        Under async scheduling the tokens resolve as many placeholders. is_stale: the output of a step scheduled
        before the request was preempted; its tokens are appended, but the counters were reset at preemption,
        so they stay as they are."""
        num_rejected = len(spec_token_ids) - (len(new_token_ids) - 1) if spec_token_ids else 0
        if not is_stale:  # the rejected drafts' slots hold guesses, which the next step overwrites
            request.num_computed_tokens -= num_rejected
            if request.num_output_placeholders > 0:
                request.num_output_placeholders -= num_rejected + len(new_token_ids)
        for num_new, token in enumerate(new_token_ids, 1):
            request.append_output_token_ids(token)
            status = self.check_stop(request)
            if status is not None:
                if not is_stale:
                    request.num_computed_tokens -= len(new_token_ids) - num_new
                return status
        return None

    def check_stop(self, request: Request) -> RequestStatus | None:
        """The finished status the request's last appended token gives it (EOS unless ignore_eos; one of
        stop_token_ids; max_tokens; max_model_len), or None while it runs on. It changes nothing: vLLM 0.33's
        check_stop (sched/utils.py) sets request.status and stop_reason itself (here Request.stop_reason reads
        it) and returns whether the request stopped. min_tokens needs no check here: until then the sampler
        never draws EOS or a stop token."""
        params = request.sampling_params
        last = request.output_token_ids[-1]
        if (last == request.eos_token_id and not params.ignore_eos) or last in params.stop_token_ids:
            return RequestStatus.FINISHED_STOPPED
        if len(request.output_token_ids) >= params.max_tokens or request.num_tokens >= self.config.max_model_len:
            return RequestStatus.FINISHED_LENGTH_CAPPED
        return None

    def finish_requests(self, request_ids: Iterable[str], status: RequestStatus) -> None:
        """End requests from outside (a stop string matched, or an abort)."""
        for req_id in request_ids:
            request = self.requests.get(req_id)
            if request is not None:
                self._finish(request, status)

    def _finish(self, request: Request, status: RequestStatus) -> None:
        # The scheduler lets go first, the KV cache manager last: a manager that raises while freeing
        # leaves no half-finished request in the queues (the engine frees its blocks again on an abort).
        request.status = status
        if request in self.running:
            self.running.remove(request)
        elif request in self.waiting:
            self.waiting.remove_request(request)
        self.requests.pop(request.request_id, None)
        self.finished_req_ids.add(request.request_id)
        self.kv_cache_manager.free(request)
