"""The engine loop: schedule, run the model, turn tokens into text (vllm/v1/engine/).

One `step()` is one forward pass. Requests join and leave between steps, so a long generation
never blocks a short one (continuous batching).
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass
from typing import Protocol

from nanoengine.core import BlockTokensHasher, KVCacheManagerInterface, PrefixCacheStats, get_hash_fn_by_name, get_request_block_hasher
from nanoengine.errors import EngineStalledError
from nanoengine.model_runner import ModelRunner
from nanoengine.outputs import CompletionOutput, Logprob, PromptLogprobs, RequestMetrics, RequestOutput, SampleLogprobs
from nanoengine.request import Request, RequestStatus
from nanoengine.sampling_params import SamplingParams
from nanoengine.scheduler import SchedulerInterface, SchedulerOutput
from nanoengine.tokenizer import IncrementalDetokenizer, Tokenizer

_FINISH_REASONS = {
    RequestStatus.FINISHED_STOPPED: "stop",
    RequestStatus.FINISHED_LENGTH_CAPPED: "length",
    RequestStatus.FINISHED_ABORTED: "abort",
}


@dataclass(slots=True)
class EngineStats:
    """Totals since the engine started. Hit rate is in tokens, counted at admission, and excludes
    re-admissions after preemption (their recompute is not a cache win)."""

    num_steps: int = 0
    num_preemptions: int = 0
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    kv_cache_usage: float = 0.0
    num_prefill_tokens: int = 0
    num_decode_tokens: int = 0

    @property
    def prefix_cache_hit_rate(self) -> float:
        return self.prefix_cache_hits / self.prefix_cache_queries if self.prefix_cache_queries else 0.0


@dataclass(slots=True)
class _OutputState:
    request: Request
    prompt: str | None
    detokenizer: IncrementalDetokenizer | None
    first_token_time: float | None = None
    finish_reason: str | None = None
    stop_reason: str | None = None
    stop_at: int | None = None  # where a stop string begins: the text ends there
    logprobs: SampleLogprobs | None = None
    cumulative_logprob: float | None = None
    prompt_logprobs: PromptLogprobs | None = None

    @property
    def text(self) -> str:
        """The completion so far, cut before a stop string."""
        return self.detokenizer.text[: self.stop_at] if self.detokenizer else ""


class StepObserver(Protocol):
    """Watches every engine step through public state only (the course's timelines and maps).

    on_schedule runs after schedule() and before the forward pass, while the pool still shows what
    the scheduler just allocated; running_before lists the running request ids as the step began.
    on_step runs at the end with the step's finished outputs and its prefix-cache lookups.
    """

    def on_schedule(self, scheduler: SchedulerInterface, scheduler_output: SchedulerOutput,
                    running_before: tuple[str, ...]) -> None: ...

    def on_step(self, scheduler_output: SchedulerOutput, finished: list[RequestOutput],
                prefix_cache_stats: PrefixCacheStats | None, seconds: float) -> None: ...


class LLMEngine:
    def __init__(self, runner: ModelRunner, scheduler: SchedulerInterface, tokenizer: Tokenizer | None,
                 hash_algo: str = "xxhash", hash_block_tokens: BlockTokensHasher | None = None):
        self.runner, self.scheduler, self.tokenizer = runner, scheduler, tokenizer
        self.kv_cache_manager: KVCacheManagerInterface = scheduler.kv_cache_manager
        self.hash_block_tokens = hash_block_tokens  # None: the engine's own chained hash
        self.block_hasher = get_request_block_hasher(
            scheduler.block_size, get_hash_fn_by_name(hash_algo), hash_block=hash_block_tokens
        )
        self.outputs: dict[str, _OutputState] = {}
        self.stats = EngineStats()
        self.observers: list[StepObserver] = []
        self._ids = itertools.count()

    def add_request(self, prompt_token_ids: list[int], params: SamplingParams, prompt: str | None = None,
                    priority: int = 0, cache_salt: str | None = None) -> str:
        req_id = str(next(self._ids))
        request = Request(
            req_id, prompt_token_ids, sampling_params=params, eos_token_id=self.tokenizer.eos_token_id if self.tokenizer else None,
            block_hasher=self.block_hasher, cache_salt=cache_salt, priority=priority,
            arrival_time=time.perf_counter(),
        )
        detokenizer = IncrementalDetokenizer(self.tokenizer) if self.tokenizer else None
        state = self.outputs[req_id] = _OutputState(request, prompt, detokenizer)
        if params.logprobs is not None:
            state.logprobs, state.cumulative_logprob = [], 0.0
        self.scheduler.add_request(request)
        return req_id

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests()

    def step(self) -> list[RequestOutput]:
        """One forward pass. Returns the requests that finished in it."""
        start = time.perf_counter()
        running_before = tuple(r.request_id for r in self.scheduler.running) if self.observers else ()
        so = self.scheduler.schedule()
        if not (so.total_num_scheduled_tokens or so.preempted_req_ids) and self.has_unfinished_requests():
            self._stalled()
        for observer in self.observers:
            observer.on_schedule(self.scheduler, so, running_before)
        sampled = self.runner.execute_model(so)
        self._collect_logprobs(sampled)
        finished = self.scheduler.update_from_output(so, sampled)
        now = time.perf_counter()
        cache_stats = self._record(so)
        stopped = [req_id for req_id in sampled if self._detokenize(req_id, now)]
        self.scheduler.finish_requests(stopped, RequestStatus.FINISHED_STOPPED)
        done = finished + [self.outputs[r].request for r in stopped]
        outputs = [self._finish(r, now) for r in done]
        for observer in self.observers:
            observer.on_step(so, outputs, cache_stats, time.perf_counter() - start)
        return outputs

    def _stalled(self) -> None:
        scheduler = self.scheduler
        raise EngineStalledError(
            f"Step {self.stats.num_steps} scheduled no token and preempted nothing, with "
            f"{len(scheduler.waiting)} requests waiting and {len(scheduler.running)} running: the engine cannot "
            "make progress. A part plugged in through a seam is the likely cause: every running request needs at "
            "least one token per step (a prefix hit must leave the last token to compute), and a waiting request "
            "must be admitted once the pool is free."
        )

    def _collect_logprobs(self, sampled: dict[str, int]) -> None:
        """Keep the logprobs the runner computed this step for the requests that asked for them."""
        for req_id, token in sampled.items():
            state = self.outputs[req_id]
            if state.logprobs is not None:
                entry = self._decoded(self.runner.logprobs[req_id])
                state.logprobs.append(entry)
                state.cumulative_logprob += entry[token].logprob
            if state.request.sampling_params.prompt_logprobs is not None and state.prompt_logprobs is None:
                # The first sampled token completes the prompt; a recompute after preemption repeats it.
                state.prompt_logprobs = [None, *map(self._decoded, self.runner.prompt_logprobs[req_id])]

    def _decoded(self, entry: dict[int, Logprob]) -> dict[int, Logprob]:
        if self.tokenizer is not None:
            for token, logprob in entry.items():
                logprob.decoded_token = self.tokenizer.decode([token], skip_special_tokens=False)
        return entry

    def _detokenize(self, req_id: str, now: float) -> bool:
        """Update the text; True if a stop string just matched (the scheduler has not finished it)."""
        state = self.outputs[req_id]
        request = state.request
        state.first_token_time = state.first_token_time or now
        stops = request.sampling_params.stop
        if state.detokenizer is None or not (new := state.detokenizer.update(request.output_token_ids)) or not stops:
            return False
        # No stop string was in the text before this step, so a match ends in the new part: search a
        # window that starts where the longest stop could begin. Stops stay exact across tokens, and
        # the earliest match wins.
        window = state.detokenizer.tail(len(new) + max(map(len, stops)) - 1)
        matches = [(i, stop) for stop in stops if (i := window.find(stop)) >= 0]
        if matches:
            i, stop = min(matches)
            state.stop_at = state.detokenizer.num_chars - len(window) + i
            state.finish_reason, state.stop_reason = "stop", stop
        return state.finish_reason is not None and not RequestStatus.is_finished(request.status)

    def _finish(self, request: Request, now: float) -> RequestOutput:
        state = self.outputs.pop(request.request_id)
        completion = CompletionOutput(
            index=0, text=state.text, token_ids=list(request.output_token_ids),
            cumulative_logprob=state.cumulative_logprob, logprobs=state.logprobs,
            finish_reason=state.finish_reason or _FINISH_REASONS[request.status], stop_reason=state.stop_reason,
        )
        return RequestOutput(
            request_id=request.request_id, prompt=state.prompt, prompt_token_ids=request.prompt_token_ids,
            outputs=[completion], num_cached_tokens=max(request.num_cached_tokens, 0),
            metrics=RequestMetrics(request.arrival_time, state.first_token_time or now, now),
            prompt_logprobs=state.prompt_logprobs,
        )

    def _record(self, so) -> PrefixCacheStats | None:
        s = self.stats
        s.num_steps += 1
        s.num_preemptions = self.scheduler.num_preemptions
        s.kv_cache_usage = self.kv_cache_manager.usage
        decodes = sum(n == 1 for n in so.num_scheduled_tokens.values())
        s.num_decode_tokens += decodes
        s.num_prefill_tokens += so.total_num_scheduled_tokens - decodes
        cache_stats = self.kv_cache_manager.make_prefix_cache_stats()
        if cache_stats is not None:
            s.prefix_cache_queries += cache_stats.queries
            s.prefix_cache_hits += cache_stats.hits
        return cache_stats
