"""Chapter 08 graded tasks: hit rates, TTFT percentiles, multi-turn prompts and hit prediction.
Run with `make grade CH=08`."""

import itertools
import statistics
from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from nanocourse import workloads
from nanocourse.policies import longest_common_prefix
from nanoengine.core import PrefixCacheStats
from nanoengine.sampling_params import SamplingParams

CHAPTER = "ch08_end_to_end"
# One thread: the engine runs tiny prompts here, and two threads on a busy 2-core machine wait on each other.
torch.set_num_threads(1)


def _engine_hit_rate(outputs):
    """The engine's own counter, fed one admission per output."""
    stats = PrefixCacheStats()
    for o in outputs:
        stats.record(len(o.prompt_token_ids), o.num_cached_tokens, preempted=False)
    return stats.hit_rate


NANOENGINE = {
    "hit_rate": _engine_hit_rate,
    "p50": statistics.median,
    "ttft_reduction": workloads.ttft_reduction,
    "make_multi_turn": workloads.conversations,
    "predict_hit_tokens": lambda prompts, block_size=16: [
        r.hit_tokens for r in workloads.block_rows(prompts, block_size)
    ],
}


def _out(prompt_len, cached):
    return SimpleNamespace(prompt_token_ids=list(range(prompt_len)), num_cached_tokens=cached)


def _engine(request, impl_call):
    """The shared engine, loaded only once impl_call has run: an unfinished stub fails before the model loads."""
    impl_call()
    return request.getfixturevalue("llm")


def _run(llm, prompts):
    """The prompts one at a time from an empty cache, as the chapter measures them."""
    assert llm.reset_prefix_cache(), (
        "the engine refused reset_prefix_cache(): some request still holds KV blocks (not a bug in your code)"
    )
    params = SamplingParams(temperature=0, max_tokens=1)
    return [llm.generate(prompt_token_ids=list(p), sampling_params=params)[0] for p in prompts]


@pytest.mark.task("08.1", "hit_rate sums tokens over requests")
def test_hit_rate(impl):
    assert impl.hit_rate([_out(100, 96), _out(20, 0)]) == pytest.approx(0.8), (
        "96 of 120 prompt tokens were cached: 0.8 (not the mean of per-request ratios, 0.48)"
    )
    assert impl.hit_rate([_out(10, 0)]) == 0.0, (
        f"one 10-token prompt with 0 cached tokens: hit rate 0.0, got {impl.hit_rate([_out(10, 0)])!r}"
    )
    assert impl.hit_rate([]) == 0.0, "no requests: 0.0, not a ZeroDivisionError"


@pytest.mark.task("08.1b", "hit_rate agrees with the engine's get_stats on a real run")
def test_hit_rate_matches_engine_stats(impl, request):
    llm = _engine(request, lambda: impl.hit_rate([]))
    shared = list(range(1000, 1040))
    before = llm.get_stats().prefix_cache_queries, llm.get_stats().prefix_cache_hits
    outs = _run(llm, [shared + [5, 6, 7], shared + [8, 9], list(range(2000, 2030))])
    stats = llm.get_stats()
    expected = (stats.prefix_cache_hits - before[1]) / (stats.prefix_cache_queries - before[0])
    assert impl.hit_rate(outs) == pytest.approx(expected), (
        f"prompts of {[len(o.prompt_token_ids) for o in outs]} tokens with {[o.num_cached_tokens for o in outs]} "
        f"cached: the engine's get_stats() says hits / queries = {expected:.4f} (cached prompt tokens over prompt "
        f"tokens, summed over requests); your hit_rate gave {impl.hit_rate(outs)!r}"
    )


@pytest.mark.task("08.2", "p50 and ttft_reduction")
def test_p50_and_reduction(impl):
    values = [30.0, 10.0, 20.0]
    assert (got := impl.p50(values)) == 20.0, (
        f"p50([30.0, 10.0, 20.0]) is the middle value once sorted, 20.0; got {got!r}"
    )
    assert values == [30.0, 10.0, 20.0], "p50 must not reorder the caller's list"
    assert impl.p50([4.0, 1.0, 3.0, 2.0]) == 2.5, "an even count takes the mean of the two middle values"
    assert impl.p50([7.0]) == 7.0, f"p50([7.0]): one value is its own median, 7.0; got {impl.p50([7.0])!r}"
    assert impl.ttft_reduction([100.0, 110.0, 90.0], [20.0, 100.0, 30.0]) == pytest.approx(0.7), (
        f"cold [100, 110, 90] ms and warm [20, 100, 30] ms: 1 - p50(warm) / p50(cold) = 1 - 30 / 100 = 0.7; got "
        f"{impl.ttft_reduction([100.0, 110.0, 90.0], [20.0, 100.0, 30.0])!r}"
    )
    assert impl.ttft_reduction([100.0], [125.0]) == pytest.approx(-0.25), "slower with the cache: negative"
    assert (got := impl.p50([5.0, 5.0, 1.0])) == 5.0, (
        f"p50([5.0, 5.0, 1.0]): equal times are separate requests, each counted, so the middle of [1.0, 5.0, 5.0] is "
        f"5.0; got {got!r}"
    )
    _p50_is_the_median(impl)


# Few distinct values, so that equal times (common once timings are rounded to the millisecond) are frequent.
TIMES = st.lists(st.sampled_from([1.0, 2.0, 3.5, 7.0, 10.0, 40.0]), min_size=1, max_size=9)


@settings(max_examples=200)
@given(cold=TIMES, warm=TIMES)
def _p50_is_the_median(impl, cold, warm):
    """p50 and ttft_reduction on random lists, against statistics.median."""
    copy = list(cold)
    assert (got := impl.p50(cold)) == statistics.median(copy), (
        f"p50({copy}) is the median, {statistics.median(copy)!r}; got {got!r}"
    )
    assert cold == copy, f"p50 must not change the caller's list: it was {copy}, it is now {cold}"
    expected = 1 - statistics.median(warm) / statistics.median(cold)
    assert (got := impl.ttft_reduction(cold, warm)) == pytest.approx(expected), (
        f"ttft_reduction(cold={cold}, warm={warm}) is 1 - p50(warm) / p50(cold) = {expected!r}; got {got!r}"
    )


@pytest.mark.task("08.3", "make_multi_turn: each turn resends the whole conversation")
def test_multi_turn_messages(impl):
    turns = impl.make_multi_turn("Be brief.", ["Hi", "Why?", "Thanks"], ["Hello!", "Because."])
    assert len(turns) == 3, f"3 user turns: one message list per user turn, 3 lists; got {len(turns)}"
    assert [m["role"] for m in turns[2]] == ["system", "user", "assistant", "user", "assistant", "user"], (
        f"the third turn sends the system message, each earlier user turn followed by its reply, then its own user "
        f"turn: roles [system, user, assistant, user, assistant, user]; got {[m['role'] for m in turns[2]]}"
    )
    assert [m["content"] for m in turns[2]] == ["Be brief.", "Hi", "Hello!", "Why?", "Because.", "Thanks"], (
        f"the third turn's contents, in order: ['Be brief.', 'Hi', 'Hello!', 'Why?', 'Because.', 'Thanks']; got "
        f"{[m['content'] for m in turns[2]]}"
    )
    assert turns[0] == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}], (
        f"the first turn sends only the system message and the first user turn, as role/content dicts; got {turns[0]}"
    )
    for earlier, later in itertools.pairwise(turns):
        assert later[: len(earlier)] == earlier, "each turn must start with the previous turn's messages"
    assert all(a is not b for a, b in itertools.pairwise(turns)), "each turn needs its own list"
    logged = impl.make_multi_turn("Be brief.", ["Hi", "Why?"], ["Hello!", "Because."])
    contents = [[m["content"] for m in turn] for turn in logged]
    assert contents == [["Be brief.", "Hi"], ["Be brief.", "Hi", "Hello!", "Why?"]], (
        f"2 user turns with a reply to each (the last reply came after the last turn was sent): one list per user "
        f"turn, and no turn sends the last reply: contents [['Be brief.', 'Hi'], ['Be brief.', 'Hi', 'Hello!', "
        f"'Why?']]; got {contents}"
    )
    assert (got := impl.make_multi_turn("Be brief.", [], [])) == [], f"no user turns: no requests, []; got {got!r}"


@pytest.mark.task("08.3b", "make_multi_turn's prompts are token prefixes of each other")
def test_multi_turn_prompts_share_prefixes(impl, request):
    llm = _engine(request, lambda: impl.make_multi_turn("s", ["u"], []))
    tok = llm.tokenizer
    turns = impl.make_multi_turn(
        "You are a rail help desk.",
        ["Is the 8:10 off-peak?", "And the 9:40?", "Ok."],
        ["No, it is a peak train.", "Yes."],
    )
    ids = [tok.encode(tok.apply_chat_template(m)) for m in turns]
    for k, (earlier, later) in enumerate(itertools.pairwise(ids)):
        assert later[: len(earlier)] == earlier, (
            f"turn {k + 2}'s prompt must start with turn {k + 1}'s whole prompt ({len(earlier)} tokens), since it "
            f"resends the conversation; they part at token {(i := longest_common_prefix(earlier, later))}: "
            f"turn {k + 2} has "
            f"{tok.decode(later[i : i + 6])!r} where turn {k + 1} has {tok.decode(earlier[i : i + 6])!r}"
        )
    hits = [o.num_cached_tokens for o in _run(llm, ids)]
    assert hits[1] == (len(ids[0]) // 16) * 16, "turn 2 must reuse every full block of turn 1"


@pytest.mark.task("08.4", "predict_hit_tokens: leading blocks, first miss, last token, all earlier prompts")
def test_predict_hits(impl):
    a = list(range(40))
    assert impl.predict_hit_tokens([a, a + [99] * 10]) == [0, 32], "a's two full blocks are cached"
    aligned = list(range(48))
    assert impl.predict_hit_tokens([aligned, aligned]) == [0, 32], "a block-aligned repeat recomputes its last block"
    b = [7] * 16 + a[16:]
    assert impl.predict_hit_tokens([a, b, a + [1, 2]]) == [0, 0, 32], (
        "the cache holds every earlier prompt, not only the previous one"
    )
    assert impl.predict_hit_tokens([a, a[:20] + [5] * 30]) == [0, 16], "a divergence inside a block loses the block"
    assert impl.predict_hit_tokens([a, a + [1]], block_size=8) == [0, 40], (
        f"block_size=8: a's 40 tokens are 5 full blocks, and the 41-token repeat a + [1] hits all 5 (its last token "
        f"is after them): expected [0, 40], got {impl.predict_hit_tokens([a, a + [1]], block_size=8)}"
    )
    first, second = [1] * 4 + [2] * 4 + [0], [3] * 4 + [4] * 4 + [0]
    mixed = [1] * 4 + [4] * 4 + [0]
    assert (got := impl.predict_hit_tokens([first, second, mixed], block_size=4)) == [0, 0, 4], (
        f"block_size=4, prompts {first}, {second}, then {mixed}: the last one's block 0 was cached by the first "
        f"prompt, but its block 1, [4, 4, 4, 4], was cached only behind a different block 0 (the second prompt's), "
        f"and a block's hash names every token before it too (chapter 04): expected [0, 0, 4], got {got}"
    )
    _predictions_match_the_engine(impl)


@st.composite
def _prompt_runs(draw):
    """(block_size, prompts): each prompt often a cut of an earlier one plus a tail, over a 3-token alphabet, so
    that shared prefixes, equal blocks behind different prefixes, exact and block-aligned repeats are frequent."""
    block_size = draw(st.integers(1, 4))
    prompts = []
    for _ in range(draw(st.integers(1, 6))):
        base = draw(st.sampled_from(prompts)) if prompts and draw(st.booleans()) else []
        prompt = base[: draw(st.integers(0, len(base)))] + draw(st.lists(st.integers(0, 2), max_size=10))
        prompts.append(prompt or [0])
    return block_size, prompts


@settings(max_examples=300)
@given(run=_prompt_runs())
def _predictions_match_the_engine(impl, run):
    """Random prompt lists against the engine's own KVCacheManager (workloads.block_rows), with no model."""
    block_size, prompts = run
    expected = [r.hit_tokens for r in workloads.block_rows(prompts, block_size)]
    assert (got := impl.predict_hit_tokens(prompts, block_size)) == expected, (
        f"block_size={block_size}, prompts {prompts} run one at a time from an empty cache: the engine's "
        f"KVCacheManager finds {expected} cached tokens, you predicted {got}"
    )


@pytest.mark.task("08.4b", "predict_hit_tokens matches the engine on a chapter workload")
def test_prediction_matches_engine(impl, request):
    llm = _engine(request, lambda: impl.predict_hit_tokens([[1, 2]], 16))
    work = workloads.code_completion(llm.tokenizer, n=3, context_tokens=16, file_tokens=64)
    measured = [o.num_cached_tokens for o in _run(llm, work.prompts)]
    assert (got := impl.predict_hit_tokens(work.prompts, 16)) == measured, (
        f"the code-completion workload's {len(work.prompts)} prompts ({[len(p) for p in work.prompts]} tokens), run "
        f"one at a time from an empty cache: the engine measured num_cached_tokens {measured}, you predicted {got}"
    )
