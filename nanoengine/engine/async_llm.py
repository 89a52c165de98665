"""The asynchronous front end: `generate()` is an async generator per request over one engine loop that steps in
the background (vllm/v1/engine/async_llm.py's AsyncLLM).

How it runs. vLLM puts the engine core in a process of its own (EngineCoreProc) and talks to it over ZMQ, so the
API server's Python never waits on the scheduler's. nanoengine keeps one process: an asyncio task (the engine loop)
runs each `LLMEngine.step()` in a one-thread executor and awaits it. The event loop stays free during the step
(torch releases the GIL in its kernels, so HTTP parsing and streaming proceed meanwhile), and the engine is only
ever touched by one thread at a time: requests are added and aborted by the loop task itself, between steps, from
an inbox that generate() fills. That is continuous batching: a request joins the running batch at the next step
boundary and leaves it at the step it finishes or is aborted in. A background thread that steps on its own would
need a lock around every add and abort, and a hand-off of every output back into the event loop anyway.

What the bridge costs, measured by `python bench/async_bridge.py` (one request of 256 tokens on a tiny random-weight
model, one torch thread, a 2-core CPU shared with other jobs): the gap between one step returning and the next
starting, which holds the executor hand-off both ways, the inbox, the deltas and the caller taking them, is about
130 µs (median), beside a 1.1 ms step of that model; a SmolLM2-135M decode step took about 100 ms on the same
machine, so the bridge is a fraction of a percent of it.

A cancelled or closed generator aborts its requests at once: after each step the loop yields to the event loop
before it starts the next, so a caller that closes on seeing an output is aborted before that next step, and one
that closes while a step runs is aborted as soon as it returns. Either way no step that starts after the close
computes for the request, and its blocks are free for that step's scheduler. A step that raises has already
aborted every request (`LLMEngine.step`); each generator then raises that exception, and the loop carries on with
the next requests.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from nanoengine.engine.engine_state import EngineState, EngineStateRecorder
from nanoengine.errors import InvalidRequestError, RequestAbortedError
from nanoengine.metrics.stats import IterationStats, SchedulerStats
from nanoengine.outputs import CompletionOutput, RequestMetrics, RequestOutput
from nanoengine.sampling_params import SamplingParams
from nanoengine.validation import check_int, check_optional_str

if TYPE_CHECKING:
    from nanoengine.entrypoints.llm import LLM

# A snapshot this young answers get_engine_state's callers: however many pages watch, the engine loop copies its
# state at most ten times a second (each copy costs well under a millisecond on SmolLM2's pool, see README).
ENGINE_STATE_MAX_AGE_S = 0.1


class StatLoggerBase(Protocol):
    """Receives the scheduler's state after each step or change of the batch, and the step's latencies (None when
    no step ran), as vLLM's stat loggers do (vllm/v1/metrics/loggers.py)."""

    def record(self, scheduler_stats: SchedulerStats, iteration_stats: IterationStats | None) -> None: ...


@dataclass(slots=True, eq=False)
class _Sample:
    """One engine request of a generate() call (sample `index` of its n) and what was already sent of it."""

    index: int
    queue: asyncio.Queue[RequestOutput | BaseException]
    num_sent_tokens: int = 0
    num_sent_chars: int = 0
    last_token_time: float = 0.0


@dataclass(slots=True)
class _Call:
    """One generate() call: its prompt, its samples, and the engine request ids they got."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    cache_salt: str | None
    priority: int
    queue: asyncio.Queue[RequestOutput | BaseException] = field(default_factory=asyncio.Queue)
    engine_ids: list[str] = field(default_factory=list)


class AsyncLLM:
    """Serve an `LLM` (the engine's own, or any built with replaced parts) to many concurrent asyncio callers.

    While an AsyncLLM runs, its engine loop owns the LLM's engine: call the LLM's own generate() only after
    `shutdown()`. Stat loggers get the batch's state after every step and every change between steps;
    state_recorder (an EngineStateRecorder) keeps the last steps' plans for get_engine_state().
    """

    def __init__(self, llm: LLM, stat_loggers: Sequence[StatLoggerBase] = ()) -> None:
        self.llm, self.engine = llm, llm.engine
        self.stat_loggers = list(stat_loggers)
        self._samples: dict[str, _Sample] = {}  # engine request id -> its sample, while unfinished
        self._inbox: list[Callable[[], None]] = []  # engine changes to make before the next step, in order
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="nanoengine-step")
        self._closing = False
        self._num_requests = 0
        self._cache_totals = (0, 0)  # the engine's prefix-cache queries and hits at the last report
        self.state_recorder = EngineStateRecorder(self.engine)  # watches the engine until shutdown()
        self._state: tuple[float, EngineState] | None = None  # the last snapshot and its time.monotonic()

    # ---- requests ---------------------------------------------------------------------------------
    def generate(
        self,
        prompt: str | list[int],
        sampling_params: SamplingParams | None = None,
        request_id: str | None = None,
        *,
        cache_salt: str | None = None,
        priority: int = 0,
    ) -> AsyncIterator[RequestOutput]:
        """Stream one prompt's completions: each item is one sample's news since its previous item, as vLLM's
        RequestOutputKind.DELTA (outputs[0] holds the new text, token ids and logprobs; its `index` says which of
        the n samples; `finished` is set on that sample's last item, which carries finish_reason).

        Everything is checked now, as LLM.generate checks it (InvalidRequestError naming the argument); the
        request joins the batch at the next step once the iterator is first awaited. Closing the iterator, or
        cancelling the task awaiting it, aborts whatever of it is unfinished."""
        ((text, tokens),) = (
            self.llm._prepare(prompt, None) if isinstance(prompt, str) else self.llm._prepare(None, [prompt])
        )
        (params,) = self.llm._params_per_prompt(sampling_params, 1)
        check_optional_str(InvalidRequestError, "cache_salt", cache_salt)
        checked_priority = check_int(InvalidRequestError, "priority", priority)
        assert checked_priority is not None, "check_int refuses None unless told none_ok"
        self._num_requests += 1
        call = _Call(request_id or f"req-{self._num_requests}", text, tokens, params, cache_salt, checked_priority)
        return self._generate(call)

    async def _generate(self, call: _Call) -> AsyncIterator[RequestOutput]:
        self._submit(lambda: self._add(call))
        try:
            unfinished = call.params.n
            while unfinished:
                item = await call.queue.get()
                if isinstance(item, BaseException):
                    raise item
                unfinished -= item.finished
                yield item
        finally:
            self._submit(lambda: self._abort(call.engine_ids))

    def _add(self, call: _Call) -> None:
        try:
            for i in range(call.params.n):
                engine_id = self.engine.add_request(
                    call.prompt_token_ids,
                    call.params.child(i),
                    prompt=call.prompt,
                    priority=call.priority,
                    cache_salt=call.cache_salt,
                )
                call.engine_ids.append(engine_id)
                self._samples[engine_id] = _Sample(i, call.queue)
        except Exception as exc:  # noqa: BLE001  (a part raised: the caller hears of it, the loop serves on)
            call.queue.put_nowait(exc)

    def _abort(self, engine_ids: list[str]) -> None:
        unfinished = [i for i in engine_ids if self._samples.pop(i, None) is not None]
        self.engine.abort_request(unfinished)

    # ---- the engine loop --------------------------------------------------------------------------
    def _submit(self, change: Callable[[], None]) -> None:
        if self._closing:
            raise RequestAbortedError("This AsyncLLM is shut down; start a new one.")
        self._inbox.append(change)
        self._wake.set()
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="nanoengine-engine-loop")

    async def _run(self) -> None:
        """Apply the inbox, step, hand each sample its news; sleep while there is nothing to do."""
        loop = asyncio.get_running_loop()
        while True:
            await self._wake.wait()
            self._wake.clear()
            inbox, self._inbox = self._inbox, []
            for change in inbox:
                change()
            if self._closing:
                return
            if inbox:
                self._log(None)
            if not self.engine.has_unfinished_requests():
                continue
            try:
                finished = await loop.run_in_executor(self._executor, self.engine.step)
            except Exception as exc:  # noqa: BLE001  (step() aborted every request; each caller gets the error)
                for sample in self._samples.values():
                    sample.queue.put_nowait(exc)
                self._samples.clear()
                self._log(None)
            else:
                self._log(self._publish(finished))
            # Let the callers take this step's outputs first: one that closes now is aborted before the next step.
            await asyncio.sleep(0)
            self._wake.set()

    def _publish(self, finished: list[RequestOutput]) -> IterationStats:
        """Queue, for every sample with news, the delta since what it was last sent; time its tokens.

        A running sample's text stops short of the longest stop string but one character, which a later token
        may still turn into a stop string that must not be shown (vLLM's stop_buffer_length)."""
        now, stats = time.perf_counter(), IterationStats()
        done = {o.request_id: o for o in finished}
        for engine_id, sample in list(self._samples.items()):
            out = done.get(engine_id)
            if out is None:
                state = self.engine.outputs.get(engine_id)
                if state is None:  # not finished and gone: nothing else removes a request between steps
                    sample.queue.put_nowait(RequestAbortedError(f"Request {engine_id} was aborted by the engine."))
                    del self._samples[engine_id]
                    continue
                request = state.request
                token_ids, logprobs = request.output_token_ids, state.logprobs
                detok = state.detokenizer
                held = max(map(len, request.sampling_params.stop), default=1) - 1
                num_chars = detok.num_chars - held if detok is not None else 0
                text = detok.tail(detok.num_chars - sample.num_sent_chars) if detok is not None else ""
                text = text[: max(0, num_chars - sample.num_sent_chars)]
                completion = CompletionOutput(sample.index, text, token_ids[sample.num_sent_tokens :])
                arrival, first = request.arrival_time, state.first_token_time or now
            else:
                del self._samples[engine_id]
                final = out.outputs[0]
                token_ids, logprobs = final.token_ids, final.logprobs
                completion = CompletionOutput(
                    sample.index,
                    final.text[sample.num_sent_chars :],
                    token_ids[sample.num_sent_tokens :],
                    final.cumulative_logprob,
                    finish_reason=final.finish_reason,
                    stop_reason=final.stop_reason,
                )
                arrival, first = out.metrics.arrival_time, out.metrics.first_token_time
                if len(token_ids) > 1:
                    stats.time_per_output_tokens_iter.append((now - first) / (len(token_ids) - 1))
            num_new = len(completion.token_ids)
            if num_new == 0 and out is None:
                continue
            if logprobs is not None:
                completion.logprobs = logprobs[sample.num_sent_tokens : len(token_ids)]
            if num_new:
                if sample.num_sent_tokens == 0:
                    stats.time_to_first_tokens_iter.append(now - arrival)
                else:
                    stats.inter_token_latencies_iter += [(now - sample.last_token_time) / num_new] * num_new
                sample.last_token_time = now
            sample.num_sent_tokens += num_new
            sample.num_sent_chars += len(completion.text)
            sample.queue.put_nowait(self._delta(engine_id, out, completion, RequestMetrics(arrival, first, now)))
        return stats

    def _delta(
        self, engine_id: str, out: RequestOutput | None, completion: CompletionOutput, metrics: RequestMetrics
    ) -> RequestOutput:
        if out is None:
            state = self.engine.outputs[engine_id]
            prompt, prompt_ids, cached = state.prompt, state.request.prompt_token_ids, state.request.num_cached_tokens
        else:
            prompt, prompt_ids, cached = out.prompt, out.prompt_token_ids, out.num_cached_tokens
        return RequestOutput(
            engine_id,
            prompt,
            prompt_ids,
            [completion],
            max(cached, 0),
            metrics,
            finished=out is not None,
            prompt_logprobs=None if out is None else out.prompt_logprobs,
        )

    def _log(self, iteration: IterationStats | None) -> None:
        if not self.stat_loggers:
            return
        totals = (self.engine.stats.prefix_cache_queries, self.engine.stats.prefix_cache_hits)
        scheduler = self.engine.scheduler
        stats = SchedulerStats(
            len(scheduler.running),
            len(scheduler.waiting),
            self.engine.kv_cache_manager.usage,
            totals[0] - self._cache_totals[0],
            totals[1] - self._cache_totals[1],
        )
        self._cache_totals = totals
        for logger in self.stat_loggers:
            logger.record(stats, iteration)

    # ---- the engine's state ------------------------------------------------------------------------
    async def get_engine_state(self, max_age_s: float = ENGINE_STATE_MAX_AGE_S) -> EngineState:
        """The engine's state (block pool, free queue, requests, last step plans) between two steps.

        The engine loop takes it, from its inbox, so never while a step runs: a call made during a step waits for
        the step's end. A snapshot at most max_age_s old is returned as it is, which bounds what any number of
        callers cost the loop. If reading a part raises (a replaced pool or queue), the caller gets that error and
        the engine serves on."""
        if (state := self._recent_state(max_age_s)) is not None:
            return state
        future: asyncio.Future[EngineState] = asyncio.get_running_loop().create_future()

        def take() -> None:
            try:
                future.set_result(self._recent_state(max_age_s) or self._take_state())
            except Exception as exc:  # noqa: BLE001  (a replaced part raised: this caller hears of it, the loop serves on)
                future.set_exception(exc)

        self._submit(take)
        return await future

    def _recent_state(self, max_age_s: float) -> EngineState | None:
        if self._state is not None and time.monotonic() - self._state[0] <= max_age_s:
            return self._state[1]
        return None

    def _take_state(self) -> EngineState:
        state = self.state_recorder.take()
        self._state = (time.monotonic(), state)
        return state

    # ---- life cycle -------------------------------------------------------------------------------
    async def shutdown(self) -> None:
        """Stop the loop after the step under way, abort every unfinished request, and give the engine back."""
        if self._task is not None:
            self._inbox.append(self._abort_all)
            self._closing = True
            self._wake.set()
            await self._task
            self._task = None
        self._closing = True
        self._executor.shutdown(wait=True)
        self.state_recorder.close()

    def _abort_all(self) -> None:
        for sample in self._samples.values():
            sample.queue.put_nowait(RequestAbortedError("The AsyncLLM serving this request was shut down."))
        self._abort(list(self._samples))

    @property
    def num_unfinished_requests(self) -> int:
        """Engine requests (samples) queued or running."""
        return len(self._samples)
