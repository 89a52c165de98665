"""The engine loop: schedule, run the model, turn tokens into text (vllm/v1/engine/).

One `step()` is one forward pass. Requests join and leave between steps, so a long generation
never blocks a short one (continuous batching).
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from nanoengine.core import (
    BlockTokensHasher,
    KVCacheManagerInterface,
    PrefixCacheStats,
    get_hash_fn_by_name,
    get_request_block_hasher,
)
from nanoengine.core.sched.interface import SchedulerInterface
from nanoengine.core.sched.output import SchedulerOutput
from nanoengine.engine.detokenizer import IncrementalDetokenizer
from nanoengine.errors import EngineStalledError
from nanoengine.model.tokenizer import Tokenizer
from nanoengine.outputs import (
    CompletionOutput,
    Logprob,
    PromptLogprobs,
    RequestMetrics,
    RequestOutput,
    SampleLogprobs,
)
from nanoengine.parts import build_part
from nanoengine.request import Request, RequestStatus
from nanoengine.sampling_params import SamplingParams
from nanoengine.spec_decode.ngram_proposer import NgramProposer
from nanoengine.worker.outputs import ModelRunnerOutput
from nanoengine.worker.worker import Worker

if TYPE_CHECKING:
    from nanoengine.config.engine import EngineConfig
    from nanoengine.engine.arg_utils import EngineArgs
from nanoengine.worker.model_runner import ModelRunner

_FINISH_REASONS = {
    RequestStatus.FINISHED_STOPPED: "stop",
    RequestStatus.FINISHED_LENGTH_CAPPED: "length",
    RequestStatus.FINISHED_ABORTED: "abort",
}


@dataclass(slots=True)
class EngineStats:
    """Totals since the engine started. Hit rate is in tokens, counted at admission, and excludes
    re-admissions after preemption (their recompute is not a cache win).

    Speculative decoding (vLLM's SpecDecodingStats names): num_drafts counts verify steps of a request with
    drafts, num_draft_tokens the drafts verified, num_accepted_tokens those accepted. A decode token is a
    token of a request that is past its prompt: with drafts, its last verified token and each draft.
    """

    num_steps: int = 0
    num_preemptions: int = 0
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    kv_cache_usage: float = 0.0
    num_prefill_tokens: int = 0
    num_decode_tokens: int = 0
    num_aborted_requests: int = 0
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0

    @property
    def prefix_cache_hit_rate(self) -> float:
        return self.prefix_cache_hits / self.prefix_cache_queries if self.prefix_cache_queries else 0.0

    @property
    def draft_acceptance_rate(self) -> float:
        """Accepted drafts per draft verified (vLLM's logged "Avg Draft acceptance rate")."""
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0


@dataclass(slots=True)
class _OutputState:
    request: Request
    prompt: str | None
    detokenizer: IncrementalDetokenizer | None
    first_token_time: float | None = None
    finish_reason: str | None = None
    stop_reason: str | None = None
    stop_at: int | None = None  # where a stop string begins: the text ends there
    # The output tokens kept: a step of several tokens ends at the one that completes a stop string.
    num_token_ids: int | None = None
    logprobs: SampleLogprobs | None = None
    prompt_logprobs: PromptLogprobs | None = None

    @property
    def text(self) -> str:
        """The completion so far, cut before a stop string."""
        return self.detokenizer.text[: self.stop_at] if self.detokenizer else ""


class StepObserver(Protocol):
    """Watches every engine step through public state only (timelines, pool maps, metrics).

    on_schedule runs after schedule() and before the forward pass, while the pool still shows what
    the scheduler just allocated; running_before lists the running request ids as the step began.
    on_step runs at the end with the step's finished outputs and its prefix-cache lookups.
    """

    def on_schedule(
        self, scheduler: SchedulerInterface, scheduler_output: SchedulerOutput, running_before: tuple[str, ...]
    ) -> None: ...

    def on_step(
        self,
        scheduler_output: SchedulerOutput,
        finished: list[RequestOutput],
        prefix_cache_stats: PrefixCacheStats | None,
        seconds: float,
    ) -> None: ...


class LLMEngine:
    """proposer: n-gram drafts for speculative decoding (None: none, and no step changes unless the runner has a
    draft model). vLLM proposes in the model runner right after sampling, since a draft model's or EAGLE's
    drafts need the device and the step's KV; the runner's drafter does so here too, and the engine takes its
    drafts (ModelRunner.take_draft_token_ids). N-gram drafts need only the verified tokens, so the engine
    proposes them between steps, from the scheduler's Requests after the stop checks. Either kind reaches the
    scheduler through Scheduler.update_draft_token_ids, as vLLM's EngineCore.post_step does with async
    scheduling off (the V1 runner's path). With async scheduling, vLLM 0.33's default, the AsyncScheduler
    schedules k placeholder drafts (-1) and the worker fills in the real ones on the device. The scheduler holds
    no proposing code."""

    def __init__(
        self,
        runner: ModelRunner,
        scheduler: SchedulerInterface,
        tokenizer: Tokenizer | None,
        hash_algo: str = "xxhash",
        hash_block_tokens: BlockTokensHasher | None = None,
        proposer: NgramProposer | None = None,
        config: EngineConfig | None = None,
        worker: Worker | None = None,
    ) -> None:
        self.config, self.worker = config, worker  # None for an engine assembled from ready parts
        self.runner, self.scheduler, self.tokenizer = runner, scheduler, tokenizer
        self.proposer = proposer
        self.runner_drafts = runner.drafter is not None  # a draft model proposes in the runner
        self.kv_cache_manager: KVCacheManagerInterface = scheduler.kv_cache_manager
        self.hash_block_tokens = hash_block_tokens  # None: the engine's own chained hash
        self.block_hasher = get_request_block_hasher(
            scheduler.block_size, get_hash_fn_by_name(hash_algo), hash_block=hash_block_tokens
        )
        self.outputs: dict[str, _OutputState] = {}
        self.stats = EngineStats()
        self.observers: list[StepObserver] = []
        # The part of the step under way: schedule, execute, update or detokenize; None between steps.
        # After a step raised it names where, until the next step starts.
        self.stage: str | None = None
        # Async scheduling (vLLM's EngineCore.batch_queue, of max_concurrent_batches = 2): the steps scheduled and
        # handed to the execute thread whose output is not processed yet, newest first. None: synchronous steps.
        self.batch_queue: deque[tuple[Future[ModelRunnerOutput], SchedulerOutput]] | None = None
        if config is not None and config.scheduler_config.async_scheduling:
            self.batch_queue = deque()
            # One thread runs the forward passes in order, so step N + 1 reads step N's tokens and KV; torch
            # releases the GIL in its kernels, so the main thread schedules and detokenizes meanwhile.
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="nanoengine-execute")
        self._ids = itertools.count()

    @classmethod
    def from_engine_args(cls, engine_args: EngineArgs) -> LLMEngine:
        return cls.from_config(engine_args.create_engine_config())

    @classmethod
    def from_config(cls, config: EngineConfig) -> LLMEngine:
        """Build every layer from the config, each building its own parts, in vLLM's order (EngineCore.__init__):
        the worker loads the model and sizes the KV cache, which it then allocates under its runner; the
        scheduler builds its KV cache manager over that many blocks; the engine adds the tokenizer and, for
        n-gram drafts, the proposer."""
        worker = Worker(config)
        kv_cache_config = worker.get_kv_cache_config()
        runner = worker.initialize_from_config(kv_cache_config)
        parts = config.parts
        scheduler_cls: type[SchedulerInterface] = parts.scheduler_cls
        scheduler = build_part(
            parts.named("scheduler_cls"),
            lambda *args: scheduler_cls.from_config(*args),
            SchedulerInterface,
            ".from_config(engine_config, kv_cache_config)",
            config,
            kv_cache_config,
        )
        folder = config.model_config.folder
        spec, proposer = config.speculative_config, None
        if spec is not None and runner.drafter is None:
            proposer = build_part(
                parts.named("proposer_cls"),
                parts.proposer_cls,
                None,
                "(SpeculativeConfig, max_model_len)",
                spec,
                config.model_config.max_model_len,
            )
        return cls(
            runner,
            scheduler,
            Tokenizer(folder) if folder is not None else None,
            config.cache_config.hash_algo,
            parts.hash_block_tokens,
            proposer,
            config=config,
            worker=worker,
        )

    def add_request(
        self,
        prompt_token_ids: list[int],
        params: SamplingParams,
        prompt: str | None = None,
        priority: int = 0,
        cache_salt: str | None = None,
    ) -> str:
        req_id = str(next(self._ids))
        request = Request(
            req_id,
            prompt_token_ids,
            sampling_params=params,
            eos_token_id=self.tokenizer.eos_token_id if self.tokenizer else None,
            block_hasher=self.block_hasher,
            cache_salt=cache_salt,
            priority=priority,
            arrival_time=time.perf_counter(),
        )
        detokenizer = IncrementalDetokenizer(self.tokenizer) if self.tokenizer else None
        state = self.outputs[req_id] = _OutputState(request, prompt, detokenizer)
        if params.logprobs is not None:
            state.logprobs = []
        self.scheduler.add_request(request)
        return req_id

    def has_unfinished_requests(self) -> bool:
        """Requests unfinished, or (async scheduling) a step in flight whose output is still to be taken."""
        return self.scheduler.has_unfinished_requests() or bool(self.batch_queue)

    def abort_request(self, request_ids: Iterable[str]) -> None:
        """End unfinished requests now (vLLM's LLMEngine.abort_request, whose EngineCore.abort_requests calls
        Scheduler.finish_requests(ids, FINISHED_ABORTED)): they leave the scheduler, their blocks are freed as
        at any finish (full ones stay cached), the runner forgets them, and stats count them. Ids already
        finished, or unknown, are skipped."""
        ids = [i for i in dict.fromkeys(request_ids) if i in self.outputs or i in self.scheduler.requests]
        if not ids:
            return
        requests = [self.scheduler.requests.get(i) or self.outputs[i].request for i in ids]
        error = None
        for request in requests:
            try:
                self.scheduler.finish_requests([request.request_id], RequestStatus.FINISHED_ABORTED)
            except BaseException as exc:  # noqa: BLE001  (a part raised while letting go: free its blocks once more)
                error = error or exc
                self.kv_cache_manager.free(request)  # freeing twice is a no-op (the Protocol's rule)
        if self.batch_queue is None:  # else the execute thread may be using the runner: it learns of them from
            self.runner.remove_requests(ids)  # the next SchedulerOutput's finished_req_ids, as vLLM's does
        for req_id in ids:
            self.outputs.pop(req_id, None)
        self.stats.num_aborted_requests += len(ids)
        if not self.scheduler.requests:
            self.kv_cache_manager.block_pool.recover_free_blocks()
        if error is not None:
            raise error

    def step(self) -> list[RequestOutput]:
        """One forward pass. Returns the requests that finished in it.

        A step that raises (any part, or a KeyboardInterrupt) may have left its requests half-updated, so
        it aborts every unfinished request before the exception goes on. If it raised before its forward
        pass was done, the blocks it named for tokens not yet computed are evicted first (vLLM's
        evict_blocks), since their KV was never written; the blocks of tokens computed in earlier steps stay
        cached. vLLM instead lets the engine core die (EngineDeadError) and the server must restart."""
        # The tokens whose KV is surely written: those of processed steps (async scheduling counts more).
        computed = {r.request_id: r.num_computed_tokens - r.num_in_flight_tokens for r in self.scheduler.running}
        try:
            outputs = self._step() if self.batch_queue is None else self._step_with_batch_queue(self.batch_queue)
        except BaseException as exc:
            try:
                self._drain_batch_queue()
                self._recover(computed)
            except Exception as failure:  # noqa: BLE001  (the step's own exception is the one to report)
                exc.add_note(f"nanoengine: recovering from it raised too: {type(failure).__name__}: {failure}")
            raise
        self.stage = None
        return outputs

    def _step(self) -> list[RequestOutput]:
        start = time.perf_counter()
        so = self._schedule(may_be_empty=False)
        self.stage = "execute"
        return self._process(so, self.runner.execute_model(so), start)

    def _step_with_batch_queue(self, batch_queue: deque) -> list[RequestOutput]:
        """One step of async scheduling (vLLM's EngineCore.step_with_batch_queue): schedule a step and hand it to
        the execute thread; then, once two are in flight (or nothing is left to schedule), wait for the older and
        process its output. Returns the requests that finished in the step processed, if any."""
        start = time.perf_counter()
        if self.scheduler.has_unfinished_requests():
            # Placeholders may leave nothing to schedule while a step is in flight (its output will tell).
            so = self._schedule(may_be_empty=bool(batch_queue))
            self.stage = "execute"
            batch_queue.appendleft((self._executor.submit(self.runner.execute_model, so), so))
            if len(batch_queue) < 2 and self.scheduler.has_unfinished_requests():
                return []
        if not batch_queue:
            return []
        future, so = batch_queue.pop()
        outputs = self._process(so, future.result(), start)
        # Once every request has finished, the step still in flight (scheduled before its requests stopped) is
        # taken too, so that a caller who stops stepping then leaves nothing running (vLLM's engine core loops
        # while its batch queue is not empty).
        while batch_queue and not self.scheduler.has_unfinished_requests():
            future, so = batch_queue.pop()
            outputs += self._process(so, future.result(), start)
        return outputs

    def _drain_batch_queue(self) -> None:
        """Wait out the steps in flight, dropping their outputs and errors (a failed step's recovery needs the
        execute thread idle)."""
        while self.batch_queue:
            future, _ = self.batch_queue.pop()
            try:
                future.result()
            except BaseException:  # noqa: BLE001, S110  (the failure being handled is the one to report)
                pass

    def _schedule(self, may_be_empty: bool) -> SchedulerOutput:
        """The scheduler's next step, shown to the observers; a step that schedules nothing while it must is a
        stall."""
        running_before = tuple(r.request_id for r in self.scheduler.running) if self.observers else ()
        self.stage = "schedule"
        so = self.scheduler.schedule()
        if (
            not (may_be_empty or so.total_num_scheduled_tokens or so.preempted_req_ids)
            and self.has_unfinished_requests()
        ):
            self._stalled()
        for observer in self.observers:
            observer.on_schedule(self.scheduler, so, running_before)
        return so

    def _process(self, so: SchedulerOutput, output: ModelRunnerOutput, start: float) -> list[RequestOutput]:
        """A step's output into the scheduler, the text and the stats; returns the requests that finished."""
        self.stage = "update"
        finished = [r for r in self.scheduler.update_from_output(so, output) if r.request_id in self.outputs]
        self._collect_logprobs(output)
        now = time.perf_counter()
        cache_stats = self._record(so, output)
        self.stage = "detokenize"
        stopped = [req_id for req_id in self._taken(output) if self._detokenize(req_id, now)]
        self.scheduler.finish_requests(stopped, RequestStatus.FINISHED_STOPPED)
        if self.proposer is not None or self.runner_drafts:
            self.stage = "propose"
            self._propose(output)
        done = finished + [self.outputs[r].request for r in stopped]
        outputs = [self._finish(r, now) for r in done]
        for observer in self.observers:
            observer.on_step(so, outputs, cache_stats, time.perf_counter() - start)
        return outputs

    def _recover(self, computed: dict[str, int]) -> None:
        """After a failed step: evict what may hold unwritten KV, then abort every unfinished request.

        computed: each running request's computed tokens as the step began (a request admitted in the step
        counts from 0, so its hits are evicted too: safe, if a little wasteful)."""
        kv = self.kv_cache_manager
        suspect: set[int] = set()
        if self.stage in ("schedule", "execute"):
            for req_id in self.scheduler.requests:
                first = computed.get(req_id, 0) // self.scheduler.block_size
                for group in kv.get_block_ids(req_id):
                    suspect.update(b for b in group[first:] if b)
        evict_error = None
        if suspect:
            try:
                kv.evict_blocks(suspect)
            except Exception as exc:  # noqa: BLE001  (any failure: the fallback below holds for all)
                evict_error = exc
        self.abort_request([*self.outputs, *self.scheduler.requests])
        self.runner.remove_requests(list(self.runner.requests))
        if evict_error is not None:
            # The suspect blocks may still be cached: drop the whole cache rather than serve unwritten KV.
            kv.reset_prefix_cache()
            raise evict_error

    def _stalled(self) -> None:
        scheduler = self.scheduler
        raise EngineStalledError(
            f"Step {self.stats.num_steps} scheduled no token and preempted nothing, with "
            f"{len(scheduler.waiting)} requests waiting and {len(scheduler.running)} running: the engine cannot "
            "make progress. A part plugged in through a seam is the likely cause: while requests are unfinished, a "
            "step must schedule some token or preempt some request (a prefix hit must leave the last token to "
            "compute, and a waiting request must be admitted once the pool is free)."
        )

    def _propose(self, output: ModelRunnerOutput) -> None:
        """Drafts for each request that got tokens this step and still runs: the draft model's, which the
        runner proposed after its forward pass, or n-gram ones. A step emits at most its drafts and one token
        more, so drafts past max_tokens would be dropped unseen: they are not proposed."""
        if self.runner_drafts:
            drafts = self.runner.take_draft_token_ids()
            self.scheduler.update_draft_token_ids({r: d for r, d in drafts.items() if r in self.scheduler.requests})
            return
        assert self.proposer is not None, "_step proposes only with a proposer or a runner that drafts"
        drafts = {}
        for req_id in output.sampled_token_ids:
            request = self.scheduler.requests.get(req_id)
            if request is not None:
                num_left = request.sampling_params.max_tokens - len(request.output_token_ids) - 1
                drafts[req_id] = self.proposer.propose(request.all_token_ids, num_left)
        self.scheduler.update_draft_token_ids(drafts)

    def _taken(self, output: ModelRunnerOutput) -> list[str]:
        """The requests whose sampled tokens the scheduler took: all of them but those that finished before the
        output came (async scheduling: aborted, or stopped by a stop string, while the step ran)."""
        return [req_id for req_id in output.sampled_token_ids if req_id in self.outputs]

    def _collect_logprobs(self, output: ModelRunnerOutput) -> None:
        """Keep the logprobs the runner computed this step for the requests that asked for them, one entry per
        token the scheduler kept (it drops the tokens after a stop condition)."""
        for req_id in self._taken(output):
            state = self.outputs[req_id]
            if state.logprobs is not None:
                num_new = len(state.request.output_token_ids) - len(state.logprobs)
                state.logprobs += map(self._decoded, output.logprobs[req_id][:num_new])
            if state.request.sampling_params.prompt_logprobs is not None and state.prompt_logprobs is None:
                # The first sampled token completes the prompt; a recompute after preemption repeats it.
                state.prompt_logprobs = [None, *map(self._decoded, output.prompt_logprobs_dict[req_id])]

    def _decoded(self, entry: dict[int, Logprob]) -> dict[int, Logprob]:
        if self.tokenizer is not None:
            for token, logprob in entry.items():
                logprob.decoded_token = self.tokenizer.decode([token], skip_special_tokens=False)
        return entry

    def _detokenize(self, req_id: str, now: float) -> bool:
        """Update the text; True if a stop string just matched (the scheduler has not finished it).

        With stop strings the step's tokens are decoded one at a time: a speculative step brings several, and
        the tokens after the one that completes a stop string are dropped (as vLLM's detokenizer drops them),
        so the output is the one plain decoding gives."""
        state = self.outputs[req_id]
        request, detokenizer = state.request, state.detokenizer
        state.first_token_time = state.first_token_time or now
        params = request.sampling_params
        if detokenizer is None:
            return False
        # A request the scheduler stopped on EOS or a stop token keeps that token in token_ids but not in the
        # text (vLLM's detokenizer skips it unless include_stop_str_in_output).
        tokens = request.output_token_ids
        if request.status == RequestStatus.FINISHED_STOPPED:
            tokens = tokens[:-1]
        if not params.stop:
            detokenizer.update(tokens)
            return False
        for token in tokens[detokenizer.num_tokens :]:
            new = detokenizer.step(token)
            # Stop strings count only once min_tokens tokens are out: a match must end in a later token's text.
            if new and detokenizer.num_tokens > params.min_tokens and self._match_stop(state, new, params.stop):
                state.num_token_ids = detokenizer.num_tokens
                break
        return state.finish_reason is not None and not RequestStatus.is_finished(request.status)

    @staticmethod
    def _match_stop(state: _OutputState, new: str, stops: list[str]) -> bool:
        """Whether a stop string ends in the new text; if so, record where it begins and which it is."""
        # A match ends in the new part: search a window that starts where the longest stop could begin. Stops
        # stay exact across tokens; the earliest match wins.
        detokenizer = state.detokenizer
        assert detokenizer is not None, "_detokenize matches stop strings only with a detokenizer"
        window = detokenizer.tail(len(new) + max(map(len, stops)) - 1)
        # Each stop is searched only where it would end in the new text: text before min_tokens may hold one.
        matches = [
            (i, stop) for stop in stops if (i := window.find(stop, max(0, len(window) - len(new) - len(stop) + 1))) >= 0
        ]
        if matches:
            i, stop = min(matches)
            state.stop_at = detokenizer.num_chars - len(window) + i
            state.finish_reason, state.stop_reason = "stop", stop
        return bool(matches)

    def _finish(self, request: Request, now: float) -> RequestOutput:
        state = self.outputs.pop(request.request_id)
        token_ids = request.output_token_ids[: state.num_token_ids]
        logprobs = None if state.logprobs is None else state.logprobs[: len(token_ids)]
        completion = CompletionOutput(
            index=0,
            text=state.text,
            token_ids=token_ids,
            logprobs=logprobs,
            cumulative_logprob=None if logprobs is None else sum(e[t].logprob for e, t in zip(logprobs, token_ids)),
            finish_reason=state.finish_reason or _FINISH_REASONS[request.status],
            stop_reason=state.stop_reason if state.finish_reason else request.stop_reason,
        )
        return RequestOutput(
            request_id=request.request_id,
            prompt=state.prompt,
            prompt_token_ids=request.prompt_token_ids,
            outputs=[completion],
            num_cached_tokens=max(request.num_cached_tokens, 0),
            metrics=RequestMetrics(request.arrival_time, state.first_token_time or now, now),
            prompt_logprobs=state.prompt_logprobs,
        )

    def _record(self, so: SchedulerOutput, output: ModelRunnerOutput) -> PrefixCacheStats | None:
        s = self.stats
        s.num_steps += 1
        s.num_preemptions = self.scheduler.num_preemptions
        s.kv_cache_usage = self.kv_cache_manager.usage
        spec = so.scheduled_spec_decode_tokens
        decodes = sum(n for r, n in so.num_scheduled_tokens.items() if n == 1 + len(spec.get(r, ())))
        s.num_decode_tokens += decodes
        s.num_prefill_tokens += so.total_num_scheduled_tokens - decodes
        for req_id, drafts in spec.items():
            s.num_drafts += 1
            s.num_draft_tokens += len(drafts)
            s.num_accepted_tokens += len(output.sampled_token_ids[req_id]) - 1
        cache_stats = self.kv_cache_manager.make_prefix_cache_stats()
        if cache_stats is not None:
            s.prefix_cache_queries += cache_stats.queries
            s.prefix_cache_hits += cache_stats.hits
        return cache_stats
