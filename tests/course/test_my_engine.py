"""my_llm(): the learner's finished parts become the engine, each through its own seam."""

import time

import pytest

from nanocourse import my_engine
from nanocourse import workloads as W
from nanocourse.beyond import hit_rate
from nanocourse.grading import Scorecard, TaskResult
from nanocourse.my_engine import (
    PARTS,
    chapter_grades,
    load_exercise,
    mine_or_worked,
    my_llm,
    part_status,
    seam_owners,
    stubs_left,
)
from nanoengine import LLM, SamplingParams
from nanoengine.attention import AttentionBackend, triton_available
from nanoengine.core import BlockPoolInterface, FreeBlockQueue, KVCacheManagerInterface
from nanoengine.core.sched.interface import SchedulerInterface
from nanoengine.worker.block_table import BlockTableInterface

pytestmark = pytest.mark.model
KV_BYTES = 64 * 2**20


def _serve(llm, prompts):
    params = SamplingParams(temperature=0, max_tokens=12)
    return [llm.generate(prompt_token_ids=list(p), sampling_params=params)[0] for p in prompts]


@pytest.mark.triton
def test_untouched_stubs_leave_every_part_to_the_engine_and_it_serves(capsys):
    assert all(stubs_left(p.module) for p in PARTS), "every exercise file ships with stubs"
    llm = my_llm(kv_cache_memory_bytes=KV_BYTES)
    table = capsys.readouterr().out
    # Where Triton is missing (macOS), the kernel part says so instead of listing its stubs.
    no_triton = table.count("Triton is not installed")
    assert no_triton == (0 if triton_available() else 1)
    assert (
        table.startswith(f"Your engine: 0 of {len(PARTS)} parts are yours")
        and table.count("stubs left") == len(PARTS) - no_triton
    )
    row_13 = table.splitlines().index(next(line for line in table.splitlines() if line.startswith("  13  ")))
    assert table.splitlines()[row_13 + 1].strip() == (
        "Your chapter 13 Scheduler extends nanoengine's Scheduler, not your chapter 07 one, until chapter 07 passes "
        "its grade."
    ), "under chapter 13's row, the scheduler it extends, once"
    assert all(owner.startswith("nanoengine.") for _, _, owner in seam_owners(llm))
    out = llm.generate(prompt_token_ids=[[1, 2, 3, 4, 5]], sampling_params=SamplingParams(max_tokens=3))[0]
    assert len(out.token_ids) == 3


def test_worked_solutions_engine_equals_nanoengine_on_the_chatbot_workload(llm, capsys):
    worked = my_llm(source="solutions", kv_cache_memory_bytes=KV_BYTES)
    assert f"{len(PARTS) - 1} of {len(PARTS)} parts are worked" in capsys.readouterr().out, (
        "all but the kernels, which sit out on a CPU"
    )
    owners = {(c, s): o for c, s, o in seam_owners(worked)}
    assert all(o.startswith("solutions.") for (c, _), o in owners.items() if c != "03"), owners
    engine = worked.engine
    for obj, protocol in (
        (engine.runner.input_block_table[0], BlockTableInterface),
        (worked.backend, AttentionBackend),
        (engine.kv_cache_manager.block_pool.free_block_queue, FreeBlockQueue),
        (engine.kv_cache_manager.block_pool, BlockPoolInterface),
        (engine.kv_cache_manager, KVCacheManagerInterface),
        (engine.scheduler, SchedulerInterface),
    ):
        if protocol is not AttentionBackend:  # a plain Protocol, not runtime-checkable
            assert isinstance(obj, protocol), (obj, protocol)
    prompts = W.chatbot(llm.tokenizer, n=5).prompts
    reference = LLM(progress=False, kv_cache_memory_bytes=KV_BYTES)
    theirs, ours = _serve(worked, prompts), _serve(reference, prompts)
    assert [o.token_ids for o in theirs] == [o.token_ids for o in ours]
    assert [o.num_cached_tokens for o in theirs] == [o.num_cached_tokens for o in ours]
    assert hit_rate(theirs) == hit_rate(ours) > 0.5
    assert worked.get_stats().prefix_cache_hit_rate == reference.get_stats().prefix_cache_hit_rate
    pool = engine.kv_cache_manager.block_pool
    assert pool.get_num_free_blocks() == pool.num_gpu_blocks - 1, "no block leaks"


def test_worked_solutions_speculate_with_chapter_13s_scheduler_over_07s(llm, capsys):
    """The worked chapter 13 Scheduler extends the worked chapter 07 one: my_llm plugs in 13's, which already holds
    07's schedule(), the table says so, and the engine built from it drafts, verifies and rolls back as nanoengine
    does."""
    spec = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 3}
    worked = my_llm(source="solutions", kv_cache_memory_bytes=KV_BYTES, speculative_config=spec)
    table = capsys.readouterr().out
    assert "The worked chapter 13 Scheduler extends the worked chapter 07 Scheduler" in table
    scheduler = type(worked.engine.scheduler)
    assert [c.__module__ for c in scheduler.__mro__[:2]] == ["solutions.ch13_spec_decode", "solutions.ch07_scheduler"]
    assert scheduler.schedule is scheduler.__mro__[1].schedule, "07's schedule(), not the engine's"
    owners = {s: o for c, s, o in seam_owners(worked) if c in ("07", "13")}
    assert owners == {
        "rejection_sampler": "solutions.ch13_spec_decode.rejection_sample",
        "NgramProposer": "solutions.ch13_spec_decode.NgramProposer",
        "SchedulerInterface": "solutions.ch13_spec_decode.Scheduler on solutions.ch07_scheduler.Scheduler",
    }, owners
    prompt = "Continue the list: apple, pear, plum, apple, pear, plum, apple, pear, plum, apple,"
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    reference = LLM(progress=False, kv_cache_memory_bytes=KV_BYTES, speculative_config=spec)
    theirs, ours = (e.generate(prompt, params)[0] for e in (worked, reference))
    assert theirs.token_ids == ours.token_ids
    assert worked.get_stats().num_accepted_tokens == reference.get_stats().num_accepted_tokens > 0


def test_worked_solutions_serve_a_draft_model_and_eagle(llm, capsys, monkeypatch):
    """Every worked part serves beside a draft model or an EAGLE head: 07's and 13's schedulers reserve the
    lookahead, 06's manager takes it. Chapter 06's FullAttentionManager inherits the engine's search, EAGLE drop
    included, so it serves with EAGLE too; one with a search of its own is refused by name, and
    full_attention_manager_cls=None takes the engine's."""
    from nanoengine.errors import InvalidEngineArgumentError
    from nanoengine.model.llama_eagle import EagleLlamaForCausalLM
    from nanoengine.model.loader import embedded_gguf_path

    prompt, params = llm.apply_chat_template("Name three rivers."), SamplingParams(temperature=0, max_tokens=12)
    want = llm.generate(prompt, params)[0].token_ids
    draft = {"method": "draft_model", "model": embedded_gguf_path(), "num_speculative_tokens": 3}
    worked = my_llm(source="solutions", kv_cache_memory_bytes=KV_BYTES, speculative_config=draft)
    assert worked.generate(prompt, params)[0].token_ids == want
    stats = worked.get_stats()
    assert stats.num_accepted_tokens == stats.num_draft_tokens > 0, "SmolLM2 drafting for itself"
    eagle = {"method": "eagle", "model": EagleLlamaForCausalLM.random(llm.model), "num_speculative_tokens": 3}
    worked = my_llm(source="solutions", kv_cache_memory_bytes=KV_BYTES, speculative_config=eagle)
    assert worked.generate(prompt, params)[0].token_ids == want

    def with_own_search(module, *args):
        """The worked file, its FullAttentionManager searching on its own (as a learner's override would)."""
        loaded = load_exercise(module, *args)
        if module == "ch06_prefix_caching":

            class OwnSearch(loaded.FullAttentionManager):
                def find_longest_cache_hit(self, block_hashes, max_length, group_ids, token_ids=None):
                    return super().find_longest_cache_hit(block_hashes, max_length, group_ids, token_ids)

            loaded.FullAttentionManager = OwnSearch
        return loaded

    monkeypatch.setattr(my_engine, "load_exercise", with_own_search)
    with pytest.raises(InvalidEngineArgumentError, match="drop the last hit block") as info:
        my_llm(source="solutions", kv_cache_memory_bytes=KV_BYTES, speculative_config=eagle)
    assert info.value.parameter == "full_attention_manager_cls"
    assert "my_llm(..., full_attention_manager_cls=None)" in info.value.__notes__[-1], "the course says how"
    worked = my_llm(
        source="solutions", kv_cache_memory_bytes=KV_BYTES, speculative_config=eagle, full_attention_manager_cls=None
    )
    assert worked.generate(prompt, params)[0].token_ids == want
    capsys.readouterr()


def test_an_edit_takes_effect_without_a_restart(tmp_path):
    path = tmp_path / "ch04_hash_chains.py"
    path.write_text("def hash_block_tokens(parent, tokens, extra_keys=None):\n    raise NotImplementedError\n")
    assert stubs_left("ch04_hash_chains", tmp_path) == ["hash_block_tokens"]
    with pytest.raises(NotImplementedError):
        load_exercise("ch04_hash_chains", tmp_path).hash_block_tokens(None, [1])
    path.write_text("def hash_block_tokens(parent, tokens, extra_keys=None):\n    return b'x' * 16\n")
    assert stubs_left("ch04_hash_chains", tmp_path) == []
    assert load_exercise("ch04_hash_chains", tmp_path).hash_block_tokens(None, [1]) == b"x" * 16


def test_mine_or_worked_falls_back_while_the_stub_raises():
    module, who = mine_or_worked("ch04_hash_chains", lambda m: m.hash_block_tokens(None, [1, 2, 3]))
    assert who == "the worked solution's" and module.__name__ == "solutions.ch04_hash_chains"


@pytest.mark.triton
@pytest.mark.skipif(not triton_available(), reason="Triton is not installed (it publishes wheels for Linux only)")
def test_a_finished_kernel_part_sits_out_on_a_cpu_unless_forced():
    kernels = next(p for p in PARTS if p.argument == "attention_backend")
    assert not part_status(kernels, "solutions", use_kernels=False).used
    assert part_status(kernels, "solutions", use_kernels=True).used


def test_chapter_13_is_graded_after_07_and_regraded_when_07_changes(monkeypatch, tmp_path):
    """Chapter 13's Scheduler extends a finished chapter 07's, so its grade depends on 07's file, and my_llm grades
    07 first: the process that grades 13 then finds 07's grade in the cache rather than grading it again."""
    monkeypatch.setenv("NANOENGINE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(my_engine, "_GRADES", {})
    calls = []

    def fake_grade(chapters, impl):
        calls.append(chapters)
        return Scorecard(chapters, impl, [TaskResult(f"{c}.1", "t", True, "") for c in chapters.split(",")])

    monkeypatch.setattr(my_engine, "grade", fake_grade)
    chapter_grades(["13", "07", "04"])
    assert calls == ["04,07", "13"]
    folder = tmp_path / "exercises"
    folder.mkdir()
    for module in ("ch07_scheduler", "ch13_spec_decode"):
        (folder / f"{module}.py").write_text(my_engine.exercise_path(module).read_text())
    monkeypatch.setattr(my_engine, "exercise_path", lambda module, root=folder: root / f"{module}.py")
    before = my_engine._grade_key("13")
    (folder / "ch07_scheduler.py").write_text("# an edit to chapter 07\n", "utf-8")
    assert my_engine._grade_key("13") != before, "13's grade is keyed on 07's file too"


def test_grades_are_batched_into_one_process_and_kept_on_disk(monkeypatch, tmp_path):
    """my_llm() grades every finished chapter at once, and a new kernel (an empty memory cache) grades nothing
    again until a file changes: its second call answers in well under the 5 s a learner would wait."""
    monkeypatch.setenv("NANOENGINE_CACHE", str(tmp_path))
    monkeypatch.setattr(my_engine, "_GRADES", {})
    calls, real = [], my_engine.grade
    monkeypatch.setattr(my_engine, "grade", lambda chapter, impl: calls.append(chapter) or real(chapter, impl))
    first = chapter_grades(["05", "04", "05"])
    assert calls == ["04,05"], "the chapters not cached yet are graded together, once each"
    assert first["04"] and all(r.task.startswith("04.") for r in first["04"])
    assert first["05"] and all(r.task.startswith("05.") for r in first["05"])
    my_engine._GRADES.clear()  # as a new kernel starts
    start = time.perf_counter()
    second = chapter_grades(["04", "05"])
    assert calls == ["04,05"] and time.perf_counter() - start < 1, "no edit since: read from disk, not graded"
    assert {ch: [(r.task, r.passed, r.message) for r in card] for ch, card in second.items()} == {
        ch: [(r.task, r.passed, r.message) for r in card] for ch, card in first.items()
    }


def test_the_worked_engine_is_served_over_the_openai_api(llm, capsys):
    """The server takes any LLM: my_llm()'s answers the completions API as nanoengine's own does."""
    from fastapi.testclient import TestClient

    from nanoengine.entrypoints.openai.api_server import build_app

    worked = my_llm(source="solutions", kv_cache_memory_bytes=KV_BYTES, quiet=True)
    body = {"prompt": "The capital of France is", "temperature": 0, "max_tokens": 6, "return_token_ids": True}
    with TestClient(build_app(worked, served_model_name="mine")) as client:
        assert client.get("/v1/models").json()["data"][0]["id"] == "mine"
        choice = client.post("/v1/completions", json=body).json()["choices"][0]
    expected = llm.generate(body["prompt"], SamplingParams(temperature=0, max_tokens=6))[0]
    assert choice["token_ids"] == expected.token_ids and choice["text"] == expected.text
