"""Nothing a learner does breaks the engine: a fault raised at any call of any part, a KeyboardInterrupt
mid-step, a stream left early. After each, the same LLM holds no request, has every block free, and
answers with the same greedy tokens as before."""

import pytest

from nanoengine import LLM, SamplingParams
from nanoengine.attention import TorchBackend
from nanoengine.config import LlamaConfig
from nanoengine.core import (
    BlockPool,
    FreeKVCacheBlockQueue,
    FullAttentionManager,
    KVCacheManager,
    SlidingWindowManager,
    hash_block_tokens,
)
from nanoengine.core.sched.scheduler import Scheduler
from nanoengine.engine import llm_engine as engine_module
from nanoengine.model import LlamaForCausalLM
from nanoengine.worker import model_runner
from nanoengine.worker.block_table import BlockTable

GREEDY = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
# Shared prefixes (hits), more tokens than one step's budget (chunks) and a pool of 15 usable blocks that
# four requests outgrow (preemption); the second prompt repeats the first (a hit on a cached prompt).
PROMPTS = [list(range(1, 23)), list(range(1, 23)), list(range(1, 13)) + [90, 91, 92, 93, 94], [7] * 9]


class Fault(Exception):
    """What a broken part raises."""


class Trigger:
    """Counts the calls of the parts it wraps and raises at call number `at` (never, when None)."""

    def __init__(self):
        self.calls, self.at, self.exc = 0, None, Fault

    def tick(self, where: str) -> None:
        self.calls += 1
        if self.calls == self.at:
            raise self.exc(f"injected at call {self.calls} ({where})")


def faulty(cls, trigger: Trigger, methods):
    """A learner's part: cls with each of `methods` counting, and raising when the trigger says."""

    def wrap(name):
        original = getattr(cls, name)

        def method(self, *args, **kwargs):
            trigger.tick(name)
            return original(self, *args, **kwargs)

        method.__code__ = method.__code__.replace(co_name=name)
        return method

    return type(f"Faulty{cls.__name__}", (cls,), {name: wrap(name) for name in methods})


def tiny(**overrides):
    return LlamaForCausalLM.random(LlamaConfig.tiny(**overrides), seed=0, std=0.2)


MODEL = tiny()
HYBRID = LlamaForCausalLM.random(LlamaConfig.tiny_hybrid(8), seed=0, std=0.2)


def seams(trigger: Trigger) -> dict[str, dict]:
    """LLM(...) arguments that plug one faulty part into each seam, and a few stages beside them."""

    def hasher(parent, tokens, extra_keys=None):
        trigger.tick("hash_block_tokens")
        return hash_block_tokens(parent, tokens, extra_keys)

    backend = faulty(TorchBackend, trigger, ["store_kvcache", "decode", "prefill"])()
    return {
        "block_table_cls": {
            "block_table_cls": faulty(
                BlockTable, trigger, ["add_row", "append_row", "remove_row", "compute_slot_mapping", "get_block_tables"]
            )
        },
        "attention_backend": {"attention_backend": backend},
        "hash_block_tokens": {"hash_block_tokens": hasher},
        "free_queue_cls": {
            "free_queue_cls": faulty(
                FreeKVCacheBlockQueue, trigger, ["popleft", "popleft_n", "remove", "append_n", "prepend_n"]
            )
        },
        "block_pool": {
            "block_pool": faulty(
                BlockPool,
                trigger,
                [
                    "get_cached_block",
                    "touch",
                    "cache_full_blocks",
                    "free_blocks",
                    "get_new_blocks",
                    "get_num_free_blocks",
                ],
            )
        },
        "full_attention_manager_cls": {
            "full_attention_manager_cls": faulty(
                FullAttentionManager,
                trigger,
                [
                    "find_longest_cache_hit",
                    "get_num_blocks_to_allocate",
                    "allocate_new_computed_blocks",
                    "allocate_new_blocks",
                    "cache_blocks",
                    "free",
                ],
            )
        },
        "kv_cache_manager_cls": {
            "kv_cache_manager_cls": faulty(
                KVCacheManager,
                trigger,
                [
                    "get_computed_blocks",
                    "allocate_slots",
                    "free",
                    "record_prefix_cache_stats",
                    "get_block_ids",
                    "make_prefix_cache_stats",
                ],
            )
        },
        "scheduler_cls": {
            "scheduler_cls": faulty(
                Scheduler,
                trigger,
                [
                    "schedule",
                    "update_from_output",
                    "finish_requests",
                    "choose_victim",
                    "preempt",
                    "admit",
                    "make_output",
                ],
            )
        },
    }


def build(kwargs: dict, model=MODEL, num_blocks: int = 16) -> LLM:
    return LLM(
        model,
        block_size=4,
        num_gpu_blocks_override=num_blocks,
        max_num_batched_tokens=24,
        max_num_seqs=4,
        progress=False,
        **kwargs,
    )


def tokens(llm: LLM, prompts=PROMPTS) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in llm.generate(prompt_token_ids=prompts, sampling_params=GREEDY)]


def assert_clean(llm: LLM) -> None:
    engine = llm.engine
    assert not engine.has_unfinished_requests() and not engine.outputs and not engine.scheduler.requests
    # The runner hears of a normal finish in the next SchedulerOutput, as in vLLM; of an abort at once.
    assert set(engine.runner.requests) <= engine.scheduler.finished_req_ids, "the runner holds no aborted request"
    pool = engine.kv_cache_manager.block_pool
    assert pool.get_num_free_blocks() == llm.kv_cache.num_blocks - 1, "every non-null block is back"
    assert all(b.ref_cnt == 0 for b in pool.blocks[1:])
    assert not llm.unclaimed


def fault_points(total: int, samples: int = 9) -> list[int]:
    """The first and last calls and evenly spaced ones between: every stage a part takes part in."""
    return sorted({1, total, *(1 + i * (total - 1) // (samples - 1) for i in range(samples))})


@pytest.mark.parametrize("seam", list(seams(Trigger())))
def test_a_part_that_raises_mid_step_leaves_the_engine_whole(seam):
    trigger = Trigger()
    llm = build(seams(trigger)[seam])
    trigger.calls = 0  # LLM(...) tries a hash function once on a block of its own
    expected = tokens(llm)
    assert expected == tokens(build({})), "the wrapped part is the engine's own"
    total, trigger.calls = trigger.calls, 0
    assert total > 0
    for at in fault_points(total):
        trigger.at, trigger.calls = at, 0
        with pytest.raises(Fault) as info:
            tokens(llm)
        note = "\n".join(getattr(info.value, "__notes__", []))
        assert f"the part given as LLM({seam}=...)" in note, note
        assert "unfinished request(s) were aborted" in note
        trigger.at = None
        assert_clean(llm)
        assert tokens(llm) == expected, f"fault at call {at} of {total} changed later outputs"
        assert_clean(llm)


def test_the_sliding_window_seam_too():
    trigger = Trigger()
    cls = faulty(
        SlidingWindowManager,
        trigger,
        ["allocate_new_blocks", "remove_skipped_blocks", "free", "find_longest_cache_hit", "cache_blocks"],
    )
    llm = build({"sliding_window_manager_cls": cls}, HYBRID, num_blocks=4 * 16)
    expected = tokens(llm)
    # Counted on a warm cache, as every faulty run below finds it: a sliding group keeps only the blocks a later
    # hit can reach (sparse retention), so a warm run hits more, and calls its manager less, than a cold one.
    trigger.calls = 0
    assert tokens(llm) == expected
    total, trigger.calls = trigger.calls, 0
    for at in fault_points(total, 6):
        trigger.at, trigger.calls = at, 0
        with pytest.raises(Fault, match="injected"):
            tokens(llm)
        trigger.at = None
        assert_clean(llm)
        assert tokens(llm) == expected


@pytest.mark.parametrize(
    "stage,target",
    [
        ("execute", (model_runner.ModelRunner, "execute_model")),
        ("sample", (model_runner, "sample")),
        ("update", (engine_module.LLMEngine, "_collect_logprobs")),
        ("detokenize", (engine_module.LLMEngine, "_detokenize")),
        ("record", (engine_module.LLMEngine, "_record")),
    ],
)
@pytest.mark.parametrize("exc", [Fault, KeyboardInterrupt, MemoryError])
def test_a_fault_at_every_stage_of_a_step(monkeypatch, stage, target, exc):
    """The engine's own stages, each failing at its first, middle and last call, with an error or an interrupt."""
    llm = build({})
    owner, name = target
    original, trigger = getattr(owner, name), Trigger()
    trigger.exc = exc

    def counted(*args, **kwargs):
        trigger.tick(stage)
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, counted)
    expected = tokens(llm)
    total = trigger.calls
    for at in fault_points(total, 3):
        trigger.at, trigger.calls = at, 0
        with pytest.raises(exc):
            tokens(llm)
        trigger.at = None
        assert_clean(llm)
        assert tokens(llm) == expected
    assert llm.get_stats().num_aborted_requests >= 3


def test_a_step_that_fails_before_its_forward_pass_leaves_no_unwritten_block_cached(monkeypatch):
    """The scheduler names a prompt's full blocks when it allocates them, before the forward pass writes
    their KV. A step that dies in between must not leave those names behind, or the next request with
    that prompt would hit blocks of garbage."""
    llm = build({}, tiny())
    expected = tokens(llm, [PROMPTS[0]])
    llm = build({}, tiny())
    monkeypatch.setattr(model_runner.ModelRunner, "execute_model", lambda *a: (_ for _ in ()).throw(Fault("x")))
    with pytest.raises(Fault):
        tokens(llm, [PROMPTS[0]])
    monkeypatch.undo()
    assert_clean(llm)
    out = llm.generate(prompt_token_ids=[PROMPTS[0]], sampling_params=GREEDY)[0]
    assert out.num_cached_tokens == 0 and out.outputs[0].token_ids == expected[0]
    # Blocks whose KV a finished step did write stay cached.
    assert llm.generate(prompt_token_ids=[PROMPTS[0]], sampling_params=GREEDY)[0].num_cached_tokens == 20


@pytest.fixture(scope="module")
def real():
    """stream() works on text, so these tests take the embedded model and its tokenizer."""
    return LLM(progress=False, num_gpu_blocks_override=40)


LONG = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)


@pytest.mark.model
def test_streams_closed_or_dropped_early_abort_their_request(real):
    expected = real.generate("The moon is", GREEDY)[0].text
    aborted = real.get_stats().num_aborted_requests
    stream = real.stream("Tell me a story", LONG)
    assert next(stream) + next(stream)
    stream.close()
    assert_clean(real)
    stream = real.stream("Tell me a story", LONG)
    next(stream)
    del stream  # garbage-collected: CPython closes it at once
    assert_clean(real)
    for _ in zip(range(3), real.stream("Tell me a story", LONG)):
        pass  # a loop left early
    assert_clean(real)
    unstarted = real.stream("Tell me a story", LONG)  # checked now, queued only once iterated
    assert not real.engine.has_unfinished_requests()
    del unstarted
    assert real.get_stats().num_aborted_requests == aborted + 3
    assert real.generate("The moon is", GREEDY)[0].text == expected


@pytest.mark.model
def test_a_paused_stream_survives_another_call_and_learns_when_a_failed_step_ended_it(real, monkeypatch):
    from nanoengine.errors import RequestAbortedError

    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    alone = "".join(real.stream("Tell me a story", params))
    paused = real.stream("Tell me a story", params)
    first = next(paused)
    assert real.generate("The moon is", GREEDY)  # its steps serve the paused stream's request too
    assert first + "".join(paused) == alone
    assert_clean(real)
    paused = real.stream("Tell me a story", params)
    next(paused)
    monkeypatch.setattr(model_runner, "sample", lambda *a: (_ for _ in ()).throw(Fault("x")))
    with pytest.raises(Fault):
        real.generate("The moon is", GREEDY)
    monkeypatch.undo()
    with pytest.raises(RequestAbortedError, match="Start the stream again"):
        next(paused)
    assert_clean(real)
    assert "".join(real.stream("Tell me a story", params)) == alone
