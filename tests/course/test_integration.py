"""Chapter 10's part diff: the worked solutions' parts, each alone in the engine, do what nanoengine does on
every workload, and one-line mistakes show up where they matter, by name."""

from nanocourse.integration import WORKLOADS, engines_per_part, part_diff, serve, tiny_model, with_mistake
from nanocourse.my_engine import PARTS
from nanoengine import LLM


def test_the_workloads_preempt_and_score_prompts():
    model = tiny_model()
    runs = {w.name: serve(LLM(model, progress=False, **w.engine_args), w) for w in WORKLOADS}
    assert runs["preemption-heavy"].preemptions > 0
    scored = runs["prompt logprobs"]
    assert any(p is not None for p in scored.prompt_logprobs) and 0 in scored.hits[1:], (
        "a scoring request after the first reads nothing from the cache"
    )


def test_worked_parts_alone_match_nanoengine_and_mistakes_show_where_they_matter():
    table = part_diff(engines_per_part("solutions"))
    assert table.count("same as nanoengine") == (len(PARTS) - 1) * len(WORKLOADS) and "differ" not in table
    part = {p.name: p for p in PARTS}
    table = part_diff(
        {
            "forward": with_mistake(part["KVCacheManager"], "free releases the request first to last"),
            "oldest": with_mistake(part["Scheduler"], "FCFS preempts the oldest request"),
        }
    )
    forward, oldest = table.split("oldest\n")
    assert "preemption-heavy:  prefill tokens differ" in forward and forward.count("same as nanoengine") == 2
    assert "finish order" in oldest and "chatbot:           same as nanoengine" in oldest


def test_no_part_of_an_untouched_course_serves():
    assert "no part serves yet" in part_diff({})
