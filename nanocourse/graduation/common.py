"""What every graduation check shares: the parts it graduates, its result, hash classes, hypothesis's settings."""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from hypothesis import HealthCheck, Verbosity, settings

from nanoengine.core import FreeKVCacheBlockQueue, FullAttentionManager, KVCacheManager, hash_block_tokens
from nanoengine.core.block_pool import BlockPool
from nanoengine.core.sched.scheduler import Scheduler
from nanoengine.kv_cache_interface import KVCacheGroupSpec, get_kv_cache_groups

BS = 4  # tokens per block: small, so that short prompts fill several blocks

# Where nanoengine differs from vLLM 0.33.0 on purpose, or where vLLM only accepts some inputs; the run compares
# around each as said here, and prints this list with every report. It never skips a comparison silently.
ON_PURPOSE = (
    (
        "Block hashes: nanoengine packs tokens and extra keys into its own bytes where vLLM pickles a tuple, and keys "
        "group 0 by the bare hash where vLLM appends the group id; so hashes are compared by class (each side's hashes "
        "renamed h0, h1, ... in order of first sight: equal names iff equal hashes), not byte for byte."
    ),
    (
        "LoRA: vLLM keys a block by the adapter's name and path, nanoengine by its name; the run gives each name one "
        "path, so the two keys fall in the same classes."
    ),
    (
        "New block ids of a running request that got none: nanoengine sends one empty list per KV cache group where "
        "vLLM sends None (KVCacheBlocks.get_block_ids(allow_none=True)); both are compared as None."
    ),
    (
        "Resumed requests: vLLM sends a preempted request that resumes among the cached requests (resumed_req_ids, "
        "with all its block ids); nanoengine sends it as a new one. Both are compared as admissions, in scheduling order."
    ),
    (
        "Valid inputs only: vLLM refuses to start with a max_model_len its KV cache cannot hold "
        "(kv_cache_planning.check_enough_kv_cache_memory), with max_num_batched_tokens below max_num_seqs "
        "(SchedulerConfig.verify_max_model_len) or not above a draft model's lookahead slots (VllmConfig), and "
        "refuses a prompt of max_model_len tokens or more (input_processor.py). So max_model_len is the most the pool "
        "holds (by vLLM's own spec sizing; the check 'max_model_len beyond the pool' keeps the course's 8192), "
        "prompts are cut below it, max_num_seqs is cut to the budget and a draft model's budget raised past its "
        "lookahead."
    ),
    (
        "Prefix-cache stats: vLLM's update_from_output takes them into SchedulerStats; the engine's are read from its "
        "manager after the step. Both are the counts since the previous step."
    ),
)


@dataclass
class Parts:
    """The nanoengine classes a run graduates (the engine's own by default)."""

    whose: str = "nanoengine's"
    hash_block_tokens: Any = hash_block_tokens
    free_queue_cls: type = FreeKVCacheBlockQueue
    block_pool_cls: Any = BlockPool
    kv_cache_manager_cls: type = KVCacheManager
    scheduler_cls: type = Scheduler
    # More KVCacheManager keywords: the learner's single-type managers (full_attention_manager_cls, ...).
    manager_kwargs: dict[str, Any] = field(default_factory=dict)
    table: str = ""  # which parts are whose (my_engine's table), for the learner's and the solutions' runs

    @property
    def subject(self) -> str:
        """How a story names this side's values: "yours", "nanoengine's", "the worked solutions'"."""
        return "yours" if self.whose == "your" else self.whose


def parts_for(which: str) -> Parts:
    """The engine's own parts, the worked solutions', or the learner's finished ones (the engine's where a chapter
    is not finished: my_engine's rule, which grades the chapters first)."""
    if which == "engine":
        return Parts()
    from nanocourse.checkout import use_checkout
    from nanocourse.my_engine import (
        PARTS,
        SOURCES,
        chapter_grade,
        load_exercise,
        my_parts,
        part_status,
        parts_table,
        stubs_left,
    )

    use_checkout()
    source = "solutions" if which == "solutions" else "exercises"
    statuses = [part_status(p, source) for p in PARTS if not p.instantiate]
    kw = my_parts(statuses, source)
    parts = Parts(
        whose="the worked solutions'" if which == "solutions" else "your", table=parts_table(statuses, source)
    )
    if "hash_block_tokens" in kw:
        parts.hash_block_tokens = kw["hash_block_tokens"]
    pool_cls = kw.get("block_pool", parts.block_pool_cls)
    if "free_queue_cls" in kw:
        parts.free_queue_cls = kw["free_queue_cls"]
        pool_cls = functools.partial(pool_cls, free_queue_cls=parts.free_queue_cls)
    parts.block_pool_cls = pool_cls
    parts.kv_cache_manager_cls = kw.get("kv_cache_manager_cls", parts.kv_cache_manager_cls)
    if "full_attention_manager_cls" in kw:
        parts.manager_kwargs["full_attention_manager_cls"] = kw["full_attention_manager_cls"]
    parts.scheduler_cls = kw.get("scheduler_cls", parts.scheduler_cls)
    # Chapter 12's SlidingWindowManager is no LLM part (the embedded model has no sliding layers); here it serves the
    # sliding-window checks, by the same rule: the worked one, or yours once chapter 12's graded tasks all pass.
    if which == "solutions":
        parts.manager_kwargs["sliding_window_manager_cls"] = load_exercise(
            "ch12_hybrid", SOURCES["solutions"]
        ).SlidingWindowManager
    elif not stubs_left("ch12_hybrid") and all(r.passed for r in chapter_grade("12")):
        parts.manager_kwargs["sliding_window_manager_cls"] = load_exercise("ch12_hybrid").SlidingWindowManager
    return parts


class KnownDifference(Exception):
    """A workload reached a difference the graduation names instead of comparing past it (KNOWN_DIFFERENCES'
    key `case`): the check counts it and reports it with its first workload, and the workload is compared no
    further. Not an AssertionError, so hypothesis does not take it for a divergence."""

    def __init__(self, case: str) -> None:
        super().__init__(case)
        self.case = case


# The differences a check reports by name, with why they are not nanoengine's to copy or to change.
KNOWN_DIFFERENCES = {
    "vLLM's own assert": (
        "with long_prefill_token_threshold < 1 + k, vLLM 0.33 pads a new one-token request to 1 + k, cuts it to the "
        "threshold and fails `assert num_new_tokens == 1 + self.num_spec_tokens` (scheduler.py:1579), or, where "
        "the step's budget cannot hold 1 + k, leaves it waiting (a stall when it is the queue's head); nanoengine "
        'leaves such a request unpadded, as the open upstream fix does (vllm-project/vllm#54028, "Skip spec '
        'padding below prefill threshold")'
    ),
    "EAGLE needs the engine's full-attention search": (
        "chapter 06 gives the learner the engine's FullAttentionManager.find_longest_cache_hit; a learner who "
        "overrides it leaves use_eagle to the engine, and LLM refuses EAGLE drafts with a full-attention search "
        "that is not the engine's (EngineConfig); so with such parts "
        "the EAGLE scheduler check reports its workloads here, and the manager checks compare them without EAGLE"
    ),
    "a lone request outgrew the pool": (
        "only where max_model_len is beyond the pool, which vLLM 0.33 refuses to start with "
        "(kv_cache_planning.check_enough_kv_cache_memory): nanoengine ends the request FINISHED_LENGTH_CAPPED, "
        "where vLLM's scheduler preempts it and never completes it (it waits, or is readmitted and preempted at "
        "the same point for ever); with drafts nanoengine preempts it too, which drops them, and ends it when it "
        "then cannot be admitted into an idle pool (a prefix hit can pad it back to 1 + k, and then vLLM leaves "
        "it waiting), or when it outgrows the pool again without drafts"
    ),
}


@dataclass
class Result:
    """One check's outcome: examples run, operations compared, and on a difference the shortest story; known:
    per KNOWN_DIFFERENCES case, the workloads that reached it and the first of them."""

    name: str
    operations: int = 0
    examples: int = 0
    seconds: float = 0.0
    divergence: str | None = None
    example: dict[str, Any] = field(default_factory=dict)  # the arguments of the example run last
    known: dict[str, tuple[int, Any]] = field(default_factory=dict)

    def count_known(self, case: str, workload: Any) -> None:
        count, first = self.known.get(case, (0, workload))
        self.known[case] = (count + 1, first)


def has_engine_eagle_search(parts: Parts) -> bool:
    """Whether parts' full-attention manager searches as the engine's does, dropping a hit's last block under
    use_eagle: the only one LLM takes with EAGLE drafts (EngineConfig)."""
    full_cls = parts.manager_kwargs.get("full_attention_manager_cls", FullAttentionManager)
    return full_cls.find_longest_cache_hit is FullAttentionManager.find_longest_cache_hit


def kv_cache_groups(windows: Sequence[int | None], use_eagle: bool) -> tuple[list[KVCacheGroupSpec], set[int]]:
    """The engine's KV cache groups for windows, with an EAGLE head's one full-attention layer when use_eagle (as
    EngineConfig.kv_cache_groups plans them), and the ids of the groups flagged is_eagle_group, to flag vLLM's the
    same way (Vllm.kv_cache_config)."""
    groups = get_kv_cache_groups(windows, [None] if use_eagle else [])
    return groups, {group_id for group_id, g in enumerate(groups) if g.is_eagle_group}


class Labels:
    """Each side's hash values renamed h0, h1, ... in order of first sight: equal names iff the side's hashes are
    equal, so two sides agree iff their hashes fall into the same classes in the same order."""

    def __init__(self) -> None:
        self.names: dict[int, dict[Any, str]] = {}

    def __call__(self, side: object, value: Any) -> str:
        names = self.names.setdefault(id(side), {})
        return names.setdefault(value, f"h{len(names)}")


def cached_blocks(pool: Any) -> list[tuple[int, Any]]:
    """(block id, hash) of every block the prefix cache names, by block id, read off either side's blocks."""
    return sorted((b.block_id, b.block_hash) for b in pool.blocks if b.block_hash is not None)


def hypothesis_settings(max_examples: int) -> settings:
    """The same examples on every run (derandomized), quiet, one counterexample: the shortest hypothesis finds."""
    return settings(
        max_examples=max_examples,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
        verbosity=Verbosity.quiet,
        report_multiple_bugs=False,
    )


@contextlib.contextmanager
def timed(result: Result) -> Iterator[None]:
    start = time.perf_counter()
    try:
        yield
    finally:
        result.seconds = time.perf_counter() - start


def run_property(result: Result, property_: Callable[..., None], vllm: Any, subject: str) -> Result:
    """Run a check's hypothesis property, timing it. On a difference, hypothesis has replayed the shortest example
    last (each property keeps its arguments in result.example); it runs once more with vLLM's calls traced, and
    result.divergence gets the story and the vLLM functions the failing operation ran."""
    with timed(result):
        try:
            property_()
        except NotImplementedError as error:  # the part's own stub (a stand-in raises StandInReached instead)
            result.divergence = f"a stub of {result.name}'s part was reached: {error}"
            return result
        except AssertionError as error:
            result.divergence = str(error)
            vllm.tracing = True
            try:
                property_.hypothesis.inner_test(**result.example)
            except AssertionError as again:
                # The story's first line is "<operation>: <field>: <subject> ..., vLLM's ...".
                field = str(again).split(f": {subject} ", 1)[0].rsplit(": ", 1)[-1]
                result.divergence = f"{again}\nvLLM's code in that operation (where to read why):\n" + "\n".join(
                    f"  {line}" for line in vllm.trace.lines(field)
                )
            finally:
                vllm.tracing = False
    return result
