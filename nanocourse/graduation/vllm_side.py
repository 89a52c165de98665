"""vLLM's own BlockPool, KVCacheManager and Scheduler (loaded from the wheel by loader.py), built for the
graduation's configurations and driven through the same calls as nanoengine's parts.

VllmScheduler puts vLLM's Scheduler behind the interface nanocourse/differential.py's replay_workload drives (the
engine's Request, ModelRunnerOutput and RequestStatus go in and are translated; vLLM's objects come out, whose
observable fields have the engine's names). Nothing here decides anything: every plan, block and count is vLLM's.
"""

from __future__ import annotations

import contextlib
import importlib
import linecache
import sys
import traceback
from collections.abc import Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from nanocourse.graduation.common import KnownDifference
from nanocourse.graduation.config import vllm_config
from nanocourse.graduation.loader import COMPARED_MODULES, WHEEL_PREFIX, VllmModules
from nanoengine.request import Request as EngineRequest
from nanoengine.request import RequestStatus as EngineRequestStatus
from nanoengine.worker.outputs import ModelRunnerOutput as EngineModelRunnerOutput

# vLLM 0.33's assert after padding a new request to 1 + k (scheduler.py:1579), which a threshold below 1 + k fails.
PAD_ASSERT = "assert num_new_tokens == 1 + self.num_spec_tokens"
COMPARED_PREFIXES = tuple(f"{WHEEL_PREFIX}{m.replace('.', '/')}.py" for m in COMPARED_MODULES)


class Trace:
    """The functions of vLLM's compared files that one operation ran, in the order first entered, each with the
    line it was defined on and the last condition (if, elif, while) it tested: where vLLM chose what it did."""

    def __init__(self) -> None:
        self.calls: dict[tuple[str, int], list[Any]] = {}
        self.executed: dict[tuple[str, int], None] = {}  # every line run, in the order first run

    def _local(self, frame: Any, event: str, arg: Any) -> Any:
        if event == "line":
            code = frame.f_code
            self.executed[(code.co_filename, frame.f_lineno)] = None
            line = linecache.getline(code.co_filename, frame.f_lineno).lstrip()
            if line.startswith(("if ", "elif ", "while ")):  # the last condition it tested: where it chose
                self.calls[(code.co_filename, code.co_firstlineno)][2] = frame.f_lineno
        return self._local

    def _global(self, frame: Any, event: str, arg: Any) -> Any:
        code = frame.f_code
        if event != "call" or not code.co_filename.startswith(COMPARED_PREFIXES):
            return None
        self.calls.setdefault((code.co_filename, code.co_firstlineno), [code.co_qualname, code.co_firstlineno, None])
        return self._local

    @contextlib.contextmanager
    def recording(self) -> Iterator[None]:
        previous = sys.gettrace()
        sys.settrace(self._global)
        try:
            yield
        finally:
            sys.settrace(previous)

    def lines(self, field: str, limit: int = 6) -> list[str]:
        """For a differing field: the lines of MARKERS that ran (the statements that make that observable, in the
        order run), else the deciding functions (DECIDES) with the last condition each tested, quoted; then the
        functions of the operation, in the order first entered (the request's own methods left out)."""
        key = next((key for key in DECIDES if key in field), None)
        deciders, markers = DECIDES.get(key, ()), MARKERS.get(key, ())
        out = [
            f"ran {path.removeprefix(WHEEL_PREFIX)}:{number}: {source}"
            for path, number in self.executed
            if any(m in (source := linecache.getline(path, number).strip()) for m in markers)
        ][:6]
        if not out:  # no statement of MARKERS ran: the last condition each deciding function tested
            for (path, _), (name, _first, last) in self.calls.items():
                if name.rsplit(".", 1)[-1] in deciders and last is not None:
                    quoted = linecache.getline(path, last).strip()
                    out.append(f"chose at {path.removeprefix(WHEEL_PREFIX)}:{last} ({name}): {quoted}")
        rest = [
            f"{path.removeprefix(WHEEL_PREFIX)}:{first} {name}"
            + (f" (last condition tested: line {last})" if last else "")
            for (path, _), (name, first, last) in self.calls.items()
            if not name.split(".")[-1].startswith(("__", "<")) and not path.endswith("v1/request.py")
        ]
        return out + rest[:limit] + ([f"... and {len(rest) - limit} more"] if len(rest) > limit else [])


# Which of vLLM's functions (by name, in whichever class) decide each observable: the field names of the checks'
# observations, matched by a word they contain. Where none of MARKERS ran, the report quotes the last condition
# each of them tested.
DECIDES = {
    "free queue": ("free_blocks", "get_new_blocks", "touch"),
    "ref_cnt": ("free_blocks", "get_new_blocks", "touch"),
    "prefix cache names": ("cache_full_blocks", "cache_blocks"),
    "block hashes": ("hash_block_tokens", "generate_block_hash_extra_keys"),
    "block": ("allocate_slots", "allocate_new_blocks", "remove_skipped_blocks", "find_longest_cache_hit"),
    "returned": ("allocate_slots", "get_computed_blocks", "find_longest_cache_hit"),
    "admitted": ("schedule",),
    "scheduled": ("schedule",),
    "preempted": ("schedule", "_preempt_request"),
    "drafts": ("schedule", "update_draft_token_ids"),
    "num_computed_tokens": ("schedule", "update_from_output"),
    "finished": ("update_from_output", "check_stop"),
    "queue": ("schedule", "_preempt_request"),
    "running list": ("schedule", "update_from_output"),
    "stats": ("record_prefix_cache_stats", "record"),
}

# The statements of vLLM's that make each observable: the report quotes those the failing operation ran.
MARKERS = {
    "free queue": (
        "blocks_to_evict_first.append",
        "blocks_to_evict_last.append",
        "free_block_queue.popleft_n",
        "free_block_queue.remove",
    ),
    "ref_cnt": ("ref_cnt -= 1", "ref_cnt += 1"),
    "prefix cache names": ("self._insert_block_hash(", "reachable_block_mask(", "_maybe_evict_cached_block("),
    "block hashes": ("hash_function((parent_block_hash",),
    "block": ("allocate_new_blocks(", "remove_skipped_blocks(", "apply_admission_cap=True"),
    "returned": ("allocate_new_blocks(", "find_longest_cache_hit(", "apply_admission_cap=True"),
    "admitted": ("self.running.append(request)", "apply_admission_cap=True", "num_new_tokens = min("),
    "scheduled": ("num_new_tokens = min(", "input_budget -=", "preempted_req = "),
    "preempted": ("preempted_req = ",),
    "drafts": ("scheduled_spec_decode_tokens[", "request.spec_token_ids = []", "input_budget -="),
    "num_computed_tokens": ("num_computed_tokens +=", "num_computed_tokens -=", "preempted_req = "),
    "finished": ("check_stop(",),
    "stats": ("prefix_cache_stats.record(",),
}


class Vllm:
    """The loaded modules, with the few constructors the run needs. Every call into vLLM goes through
    `with vllm.active():` (the caller's), since vLLM imports some modules inside its functions. With tracing on
    (the rerun of a shortest failing sequence), each operation's calls into vLLM are recorded in `trace`."""

    def __init__(self, modules: VllmModules) -> None:
        self.modules = modules
        self.tracing = False
        self.trace = Trace()
        self.kv_cache_interface = modules["vllm.v1.kv_cache_interface"]
        self.kv_cache_utils = modules["vllm.v1.core.kv_cache_utils"]
        self.request_module = modules["vllm.v1.request"]
        # sha256 over pickle, vLLM's reproducible choice (xxhash's root is random per process unless PYTHONHASHSEED).
        self.hash_fn = modules["vllm.utils.hashing"].sha256
        with modules.active():
            self.kv_cache_utils.init_none_hash(self.hash_fn)
            # vLLM's Request imports LoRARequest only for type checking; its stand-in is served the same way.
            self.lora_request_cls = importlib.import_module("vllm.lora.request").LoRARequest

    @contextlib.contextmanager
    def operation(self, continues: bool = False) -> Iterator[None]:
        """One operation on vLLM's side (continues: the same operation as the last one, e.g. a step's
        update_from_output after its schedule()); recorded when tracing."""
        if not self.tracing:
            yield
            return
        if not continues:
            self.trace = Trace()
        with self.trace.recording():
            yield

    def kv_cache_config(
        self,
        num_blocks: int,
        block_size: int,
        windows: Sequence[int | None],
        prefix_cache_retention_interval: int | None = 0,
        eagle_group_ids: Collection[int] = (),
    ) -> Any:
        """A KVCacheConfig of one group per entry of windows (None: full attention, else a sliding window of that
        many tokens), one layer each, as vLLM's KV cache config builder groups a hybrid model's layers; with the
        cache config's prefix_cache_retention_interval (0, CacheConfig's default), as kv_cache_planning copies it.
        eagle_group_ids: the groups holding an EAGLE drafter's layers, flagged is_eagle_group as kv_cache_planning
        flags them (pass those nanoengine's get_kv_cache_groups flagged; none: vLLM's fallback, every group)."""
        ki = self.kv_cache_interface
        shape = {"block_size": block_size, "num_kv_heads": 1, "head_size": 8, "dtype": torch.float32}
        groups = [
            ki.KVCacheGroupSpec(
                [f"layer.{i}"],
                ki.FullAttentionSpec(**shape)
                if window is None
                else ki.SlidingWindowSpec(**shape, sliding_window=window),
                is_eagle_group=i in eagle_group_ids,
            )
            for i, window in enumerate(windows)
        ]
        return ki.KVCacheConfig(
            num_blocks=num_blocks,
            kv_cache_tensors=[],
            kv_cache_groups=groups,
            prefix_cache_retention_interval=prefix_cache_retention_interval,
        )

    def max_model_len(self, block_size: int, windows: Sequence[int | None], num_blocks: int, budget: int) -> int:
        """The longest max_model_len vLLM starts with on this pool: the most tokens whose blocks in every group (each
        spec's own max_memory_usage_bytes, as vLLM's start-up check sizes them) fit the usable blocks. vLLM refuses a
        longer one (kv_cache_planning.check_enough_kv_cache_memory), so a lone request never outgrows its pool."""
        specs = [g.kv_cache_spec for g in self.kv_cache_config(num_blocks, block_size, windows).kv_cache_groups]

        def blocks(length: int) -> int:
            config = vllm_config(
                num_blocks=num_blocks,
                block_size=block_size,
                max_num_batched_tokens=budget,
                max_num_seqs=1,
                policy="fcfs",
                long_prefill_token_threshold=0,
                enable_prefix_caching=True,
                max_model_len=length,
            )
            return sum(spec.max_memory_usage_bytes(config) // spec.page_size_bytes for spec in specs)

        return max((n for n in range(1, (num_blocks - 1) * block_size + 1) if blocks(n) <= num_blocks - 1), default=1)

    def block_hasher(self, block_size: int) -> Any:
        return self.kv_cache_utils.get_request_block_hasher(block_size, self.hash_fn)

    def request(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        *,
        max_tokens: int,
        block_size: int,
        priority: int = 0,
        arrival_time: float = 0.0,
        cache_salt: str | None = None,
        lora_name: str | None = None,
        prompt_logprobs: int | None = None,
    ) -> Any:
        params = self.modules["vllm.sampling_params"].SamplingParams(
            max_tokens=max_tokens, ignore_eos=True, prompt_logprobs=prompt_logprobs
        )
        return self.request_module.Request(
            request_id,
            list(prompt_token_ids),
            params,
            None,
            arrival_time=arrival_time,
            priority=priority,
            cache_salt=cache_salt,
            # One adapter per name, at one path: nanoengine keys blocks by the name alone.
            lora_request=lora_name and self.lora_request_cls(lora_name, 1, f"/{lora_name}"),
            block_hasher=self.block_hasher(block_size),
        )


class _KVView:
    """vLLM's KVCacheManager as the graduation observes it: its own block pool and block ids, and the prefix-cache
    stats of the last step (vLLM's update_from_output takes them into SchedulerStats, where the engine's are read
    from the manager after the step)."""

    def __init__(self, manager: Any) -> None:
        self.manager = manager
        self.block_pool = manager.block_pool
        self.stats: Any = None

    def get_block_ids(self, request_id: str) -> tuple[list[int], ...]:
        return self.manager.get_block_ids(request_id)

    def make_prefix_cache_stats(self) -> Any:
        stats, self.stats = self.stats, None
        return stats if stats is not None else self.manager.make_prefix_cache_stats()


@dataclass
class _Admitted:
    req_id: str
    num_computed_tokens: int


@dataclass
class _Cached:
    req_ids: list[str]
    new_block_ids: list[Any]


class _Admissions:
    """vLLM's SchedulerOutput with the engine's split of admissions: vLLM sends a preempted request that resumes
    among the cached requests (resumed_req_ids, with all its block ids), nanoengine among the new ones. Here both
    new and resumed requests are admissions, in the order they were scheduled, and the cached requests are those
    that kept running. Every other field is vLLM's own."""

    def __init__(self, original: Any) -> None:
        self.original = original
        cached = original.scheduled_cached_reqs
        resumed = cached.resumed_req_ids
        admitted = [_Admitted(d.req_id, d.num_computed_tokens) for d in original.scheduled_new_reqs] + [
            _Admitted(r, n) for r, n in zip(cached.req_ids, cached.num_computed_tokens) if r in resumed
        ]
        order = list(original.num_scheduled_tokens)
        self.scheduled_new_reqs = sorted(admitted, key=lambda d: order.index(d.req_id))
        kept = [(r, ids) for r, ids in zip(cached.req_ids, cached.new_block_ids) if r not in resumed]
        self.scheduled_cached_reqs = _Cached([r for r, _ in kept], [ids for _, ids in kept])

    def __getattr__(self, name: str) -> Any:
        return getattr(self.original, name)


class VllmScheduler:
    """vLLM 0.33.0's Scheduler (its AsyncScheduler with async_scheduling), driven as replay_workload drives a
    nanoengine Scheduler."""

    def __init__(
        self,
        vllm: Vllm,
        *,
        windows: Sequence[int | None] = (None,),
        eagle_group_ids: Collection[int] = (),
        **config_kwargs: Any,
    ) -> None:
        """windows and eagle_group_ids: the KV cache groups (Vllm.kv_cache_config). config_kwargs: vllm_config's
        (the blocks, the budget, the policy, the drafts, async scheduling)."""
        num_blocks, block_size = config_kwargs["num_blocks"], config_kwargs["block_size"]
        self.vllm, self.block_size = vllm, block_size
        config = vllm_config(**config_kwargs)
        if config_kwargs.get("async_scheduling"):  # vLLM's SchedulerConfig.get_scheduler_cls
            scheduler_cls = vllm.modules["vllm.v1.core.sched.async_scheduler"].AsyncScheduler
        else:
            scheduler_cls = vllm.modules["vllm.v1.core.sched.scheduler"].Scheduler
        manager_cls = vllm.modules["vllm.v1.structured_output"].StructuredOutputManager
        self.scheduler = scheduler_cls(
            config,
            vllm.kv_cache_config(
                num_blocks, block_size, windows, config.cache_config.prefix_cache_retention_interval, eagle_group_ids
            ),
            structured_output_manager=manager_cls(),
            block_size=block_size,
            log_stats=True,
        )
        self.kv_cache_manager = _KVView(self.scheduler.kv_cache_manager)
        self._status = vllm.request_module.RequestStatus

    # What replay_workload reads.
    @property
    def requests(self) -> dict[str, Any]:
        return self.scheduler.requests

    @property
    def running(self) -> list[Any]:
        return self.scheduler.running

    @property
    def waiting(self) -> list[Any]:
        """Every waiting request in the order vLLM admits them: those holding KV blocks first (none without a
        connector), then its waiting queue."""
        return [*self.scheduler.kv_holding_waiting, *self.scheduler.waiting]

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests()

    # What replay_workload calls.
    def add_request(self, request: EngineRequest) -> None:
        self.scheduler.add_request(
            self.vllm.request(
                request.request_id,
                request.prompt_token_ids,
                max_tokens=request.sampling_params.max_tokens,
                block_size=self.block_size,
                priority=request.priority,
                arrival_time=request.arrival_time,
                cache_salt=request.cache_salt,
                prompt_logprobs=request.sampling_params.prompt_logprobs,
            )
        )

    def schedule(self) -> _Admissions:
        """vLLM's schedule(); KnownDifference("vLLM's own assert") where it fails its padding assert."""
        with self.vllm.operation():
            try:
                return _Admissions(self.scheduler.schedule())
            except AssertionError as error:
                frame = traceback.extract_tb(error.__traceback__)[-1]
                if frame.filename.endswith("v1/core/sched/scheduler.py") and PAD_ASSERT in (frame.line or ""):
                    raise KnownDifference("vLLM's own assert") from error
                raise

    def update_from_output(self, scheduler_output: _Admissions, output: EngineModelRunnerOutput) -> list[Any]:
        """vLLM's ModelRunnerOutput lists every scheduled request (an empty list where a prompt chunk samples
        nothing); the requests that finished are read off the returned outputs."""
        req_ids = list(scheduler_output.num_scheduled_tokens)
        runner_output = self.vllm.modules["vllm.v1.outputs"].ModelRunnerOutput(
            req_ids=req_ids,
            req_id_to_index={r: i for i, r in enumerate(req_ids)},
            sampled_token_ids=[list(output.sampled_token_ids.get(r, [])) for r in req_ids],
        )
        before = dict(self.scheduler.requests)
        with self.vllm.operation(continues=True):
            outputs = self.scheduler.update_from_output(scheduler_output.original, runner_output)
        finished = []
        for engine_outputs in outputs.values():
            if engine_outputs.scheduler_stats is not None:
                self.kv_cache_manager.stats = engine_outputs.scheduler_stats.prefix_cache_stats
            finished += [before[o.request_id] for o in engine_outputs.outputs if o.finished]
        return finished

    def update_draft_token_ids(self, draft_token_ids: dict[str, list[int]]) -> None:
        draft = self.vllm.modules["vllm.v1.outputs"].DraftTokenIds
        self.scheduler.update_draft_token_ids(draft(list(draft_token_ids), list(draft_token_ids.values())))

    def finish_requests(self, request_ids: Iterable[str], status: EngineRequestStatus) -> None:
        self.scheduler.finish_requests(list(request_ids), self._status[status.name])
