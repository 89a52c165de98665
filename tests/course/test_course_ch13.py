"""Chapter 13's speculative-decoding view records what real engine steps did to one request (drafts, tokens, the
three num_computed_tokens, block table, hashed blocks), and renders one recorded step without a browser. Chapter
13's Scheduler extends chapter 07's (nanocourse/builds_on.py), and the scorecard says which."""

import itertools

import pytest

from nanocourse import builds_on, my_engine
from nanocourse.builds_on import chapter_07_scheduler, scheduler_note
from nanocourse.grading import Scorecard, TaskResult, grade
from nanocourse.spec_view import (
    SpecStep,
    SpecStepView,
    record_spec_step,
    spec_step_html,
    spec_step_text,
    time_verify_steps,
)
from nanoengine import LLM, SamplingParams
from nanoengine.config import LlamaConfig
from nanoengine.core.sched.scheduler import Scheduler as EngineScheduler
from nanoengine.model import LlamaForCausalLM

BS = 4
SPEC = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 3}
# A repeating prompt over a tiny vocabulary: n-grams match from the first decode step on.
PROMPT = [3, 4, 5, 6, 7, 3, 4, 5, 6, 7, 3, 4, 5]


@pytest.fixture(scope="module")
def model():
    return LlamaForCausalLM.random(LlamaConfig.tiny(vocab_size=16), seed=0, std=0.2)


def tiny_llm(model, spec=SPEC) -> LLM:
    return LLM(model, block_size=BS, num_gpu_blocks_override=64, progress=False, speculative_config=spec)


def run_view(model, max_tokens=40) -> SpecStepView:
    view = SpecStepView(tiny_llm(model), PROMPT, max_tokens=max_tokens)
    while not view.done:
        view.step()
    return view


def test_each_recorded_step_is_what_the_engine_did(model):
    view = run_view(model)
    steps = view.steps
    assert steps[0].drafts == () and steps[0].computed_before == 0 and steps[0].computed_scheduled == len(PROMPT)
    assert sum(len(s.emitted) for s in steps) == 40 and steps[-1].finished
    assert any(s.drafts for s in steps), "the repeating prompt must give drafts"
    for prev, s in itertools.pairwise(steps):
        assert s.context[: len(prev.context)] == prev.context and s.num_verified == len(prev.context) + len(
            prev.emitted
        )
        assert s.computed_before == prev.computed_after == s.num_verified - 1
        assert s.scheduled == 1 + len(s.drafts) and s.computed_scheduled == s.computed_before + s.scheduled
        if not s.finished:  # the rollback: the rejected drafts come off, the last emitted token has no KV yet
            assert s.computed_after == s.computed_scheduled - s.rejected
            assert s.computed_after == s.num_verified + len(s.emitted) - 1
        assert s.emitted[: s.accepted] == s.drafts[: s.accepted]
        assert len(s.block_ids) * BS >= s.computed_scheduled, "the drafts' slots are allocated"
        assert s.hashed * BS <= s.num_verified, "no block holding an unverified token is hashed"
    stats = view.llm.get_stats()
    assert stats.num_draft_tokens == sum(len(s.drafts) for s in steps)
    assert stats.num_accepted_tokens == sum(s.accepted for s in steps)


def test_the_extra_token_is_named_by_the_verdict():
    base = {
        "step": 2,
        "context": (1, 2, 3),
        "scheduled": 4,
        "computed_before": 2,
        "computed_scheduled": 6,
        "block_ids": (1, 2),
        "hashed": 0,
        "block_size": BS,
        "finished": False,
    }
    bonus = SpecStep(drafts=(7, 8, 9), emitted=(7, 8, 9, 10), computed_after=6, **base)
    recovered = SpecStep(drafts=(7, 8, 9), emitted=(7, 11), computed_after=4, **base)
    plain = SpecStep(drafts=(), emitted=(5,), computed_after=3, **(base | {"scheduled": 1, "computed_scheduled": 3}))
    assert (bonus.accepted, bonus.rejected, bonus.extra) == (3, 0, "bonus")
    assert (recovered.accepted, recovered.rejected, recovered.extra) == (1, 2, "recovered")
    assert (plain.accepted, plain.rejected, plain.extra) == (0, 0, "sampled")
    assert list(recovered.draft_slots) == [3, 4, 5]
    text = spec_step_text(recovered)
    assert "verify 3 drafts [7 8 9] after [3]: 1 accepted, 2 rejected, then the recovered token [11]" in text
    assert "2 before, 6 after scheduling (+4), 4 after update_from_output (-2)" in text
    assert "draft slots at positions 3..5 in block(s) [1, 2]" in text


def test_the_html_shows_drafts_verdicts_counts_and_blocks(model):
    view = run_view(model)
    step = next(s for s in view.steps if s.drafts)
    page = spec_step_html(step)
    assert page.count("title='accepted'") == step.accepted + max(0, len(step.emitted) - 1)
    assert page.count("title='rejected'") == step.rejected
    assert f"title='{step.extra}'" in page
    for n in (step.computed_before, step.computed_scheduled, step.computed_after):
        assert f"{n}" in page
    assert "dashed" in page and all(f">{b}" in page for b in step.block_ids)
    assert spec_step_text(step, view.decode).splitlines()[0] in page.replace("&#x27;", "'")


def test_the_widget_steps_revisits_and_resets(model):
    view = SpecStepView(tiny_llm(model), PROMPT, max_tokens=12)
    assert view.text().startswith("step 0")
    view.step_button.click()
    view.step(2)
    assert len(view.steps) == 3 and view.slider.value == 3 and view.text().startswith("step 3")
    view.slider.value = 1
    assert view.text().startswith("step 1: prefill")
    other = SpecStepView(view.llm, PROMPT, max_tokens=12)  # a second view on the same engine
    other.step()
    view.reset()
    assert view.steps == [] and other.req_id in view.llm.engine.scheduler.requests, "reset aborts only its own"


def test_record_and_timing_helpers_leave_the_engine_clean(model):
    llm = tiny_llm(model)
    times = time_verify_steps(llm, PROMPT, sizes=(1, 3), repeats=2)
    assert set(times) == {1, 3} and all(t > 0 for t in times.values())
    assert not llm.engine.has_unfinished_requests()
    req = llm.engine.add_request(PROMPT, SamplingParams(temperature=0, max_tokens=3, ignore_eos=True))
    assert record_spec_step(llm.engine, req).emitted


def test_a_step_with_given_drafts_verifies_them(model):
    """step(drafts=...) hands the scheduler drafts of one's own, in place of the proposer's, for one step."""
    view = SpecStepView(tiny_llm(model), PROMPT, max_tokens=20)
    view.step()
    last = view.steps[-1].emitted[-1]
    view.step(drafts=[last ^ 1] * 3)
    s = view.steps[-1]
    assert s.drafts == (last ^ 1,) * 3 and s.accepted == 0 and s.rejected == 3 and s.extra == "recovered"
    assert s.computed_scheduled - s.computed_after == 3, "the three rejected drafts rolled back"


# ---- what chapter 13's Scheduler extends --------------------------------------------------------------------------
def test_with_chapter_07_unfinished_13_extends_the_engines_scheduler_and_says_why():
    assert chapter_07_scheduler("exercises") is EngineScheduler
    import exercises.ch13_spec_decode as stub

    assert stub.Scheduler.__bases__ == (EngineScheduler,)
    assert scheduler_note(stub.Scheduler) == (
        "Your chapter 13 Scheduler extends nanoengine's Scheduler, not your chapter 07 one, until chapter 07 passes "
        "its grade. Chapter 07: stubs left: Scheduler.schedule, Scheduler.choose_victim, chunk_size …"
    )


def test_the_worked_13_extends_the_worked_07():
    import solutions.ch07_scheduler
    import solutions.ch13_spec_decode as worked

    assert worked.Scheduler.__bases__ == (solutions.ch07_scheduler.Scheduler,)
    assert "extends the worked chapter 07 Scheduler" in scheduler_note(worked.Scheduler)


def test_a_finished_chapter_07_is_the_one_13_extends(monkeypatch):
    """Finished as my_llm decides it (part_status: no stub left, the chapter's grade passes): then your file's
    Scheduler, loaded as it is on disk now."""
    finished = my_engine.PartStatus(next(p for p in my_engine.PARTS if p.chapter == "07"), True, True, "all pass")
    monkeypatch.setattr(my_engine, "part_status", lambda part, source="exercises": finished)
    base = chapter_07_scheduler("exercises")
    assert base.__module__ == "exercises.ch07_scheduler" and base.__bases__ == (EngineScheduler,)
    sub = type("Scheduler", (base,), {})
    assert scheduler_note(sub).startswith("Your chapter 13 Scheduler extends your chapter 07 Scheduler")
    assert builds_on.chapter_07_status("solutions") == (True, "the worked solution")


def test_the_scorecard_shows_the_note_under_the_heading():
    card = Scorecard("13", "exercises", [TaskResult("13.1", "t", True, "")], notes={"13": "what it extends"})
    assert repr(card).splitlines()[:3] == [
        "Chapter 13 (exercises): 1/1 tasks pass",
        "  what it extends",
        "  ✓ 13.1   t",
    ]
    both = Scorecard("07,13", "exercises", [TaskResult("07.1", "s", True, ""), *card], notes=card.notes)
    assert "Chapter 13: 1/1 tasks pass\n  what it extends\n  ✓ 13.1" in repr(both)


def test_grading_13_on_the_stubs_says_it_extends_the_engines_scheduler():
    card = grade("13", "exercises", first=True)
    assert repr(card).splitlines()[1].startswith("  Your chapter 13 Scheduler extends nanoengine's Scheduler"), card
