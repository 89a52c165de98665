"""vLLM 0.33's sampling parameters that clients send (issue 46, item 3): min_p, presence/frequency/repetition
penalties, stop_token_ids, ignore_eos, min_tokens and logit_bias, each against a reference computed here by hand
(plain Python and torch on a small vocabulary, or on the raw logits the engine saw); their validation; the
refusal, by name, of vLLM's fields and arguments nanoengine lacks; and generate's use_tqdm."""

import collections
import functools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from nanoengine import LLM, SamplingParams
from nanoengine.errors import InvalidRequestError
from nanoengine.sample.logits_processor import RowTokens, apply_logits_processors
from nanoengine.sample.sampler import make_generator, sample, target_probs
from nanoengine.sampling_params import UNSUPPORTED
from nanoengine.worker import model_runner

EOS = 5


def reference(logits: list[float], params: SamplingParams, prompt: list[int], output: list[int]) -> list[float]:
    """vLLM's processing of one row, written out token by token from its documented rules: logit_bias added;
    EOS and stop_token_ids at -inf while len(output) < min_tokens; a token of prompt or output has a positive
    logit divided by repetition_penalty, a negative one multiplied; an output token loses frequency_penalty per
    occurrence and presence_penalty once."""
    out = list(logits)
    for token, bias in (params.logit_bias or {}).items():
        out[token] += bias
    if len(output) < params.min_tokens:
        for token in [*params.stop_token_ids, EOS]:
            out[token] = float("-inf")
    counts = collections.Counter(output)
    for token in set(prompt) | set(counts):  # every other token is left as it is
        rep = params.repetition_penalty
        out[token] = out[token] / rep if out[token] > 0 else out[token] * rep
        if token in counts:
            out[token] -= params.frequency_penalty * counts[token] + params.presence_penalty
    return out


LOGITS = [2.0, -1.0, 0.5, 3.0, -2.5, 1.0, 0.0, 4.0]
PROMPT = [0, 1, 1, 6]
OUTPUT = [3, 3, 3, 4, 7]  # 3 three times, 4 and 7 once; 0 and 1 only in the prompt; 2 and 5 nowhere


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(repetition_penalty=1.7),
        SamplingParams(repetition_penalty=0.6),
        SamplingParams(frequency_penalty=0.7),
        SamplingParams(frequency_penalty=-1.3),
        SamplingParams(presence_penalty=1.1),
        SamplingParams(presence_penalty=-0.4),
        SamplingParams(repetition_penalty=1.3, frequency_penalty=0.5, presence_penalty=0.25),
        SamplingParams(logit_bias={1: 3.5, 2: -0.25}),
        SamplingParams(logit_bias={1: 3.5}, repetition_penalty=2.0),  # the bias turns 1's logit positive first
        SamplingParams(min_tokens=6, max_tokens=10, stop_token_ids=[2, 7]),  # 5 outputs < 6: EOS, 2 and 7 banned
        SamplingParams(min_tokens=5, max_tokens=10, stop_token_ids=[2]),  # 5 outputs: nothing banned any more
        SamplingParams(min_tokens=9, max_tokens=10, ignore_eos=True),  # EOS banned even so, as in vLLM
    ],
    ids=repr,
)
def test_each_rule_matches_the_hand_computed_reference(params):
    logits = torch.tensor([LOGITS, LOGITS[::-1]])
    rows = [RowTokens(params, PROMPT, OUTPUT, EOS), None]
    got = apply_logits_processors(logits, rows)
    assert got[0].tolist() == pytest.approx(reference(LOGITS, params, PROMPT, OUTPUT))
    assert got[1].tolist() == LOGITS[::-1], "a row without processing is untouched"
    assert logits[0].tolist() == LOGITS, "the raw logits are left for the logprobs"


def test_a_batch_without_processing_returns_its_logits_untouched():
    logits = torch.randn(3, 8)
    assert apply_logits_processors(logits, [None, None, None]) is logits


@settings(max_examples=200, deadline=None)
@given(
    logits=st.lists(st.floats(-8, 8), min_size=8, max_size=8),
    prompt=st.lists(st.integers(0, 7), min_size=1, max_size=6),
    output=st.lists(st.integers(0, 7), max_size=8),
    rep=st.floats(0.1, 3),
    freq=st.floats(-2, 2),
    pres=st.floats(-2, 2),
    bias=st.dictionaries(st.integers(0, 7), st.floats(-100, 100), max_size=3),
    min_tokens=st.integers(0, 4),
)
def test_any_mix_matches_the_reference(logits, prompt, output, rep, freq, pres, bias, min_tokens):
    params = SamplingParams(
        repetition_penalty=rep,
        frequency_penalty=freq,
        presence_penalty=pres,
        logit_bias=bias,
        min_tokens=min_tokens,
        stop_token_ids=[2],
    )
    got = apply_logits_processors(torch.tensor([logits], dtype=torch.float64), [RowTokens(params, prompt, output, EOS)])
    assert got[0].tolist() == pytest.approx(reference(logits, params, prompt, output), rel=1e-9, abs=1e-9)


def test_min_p_keeps_the_tokens_at_least_min_p_times_as_likely_as_the_top_one():
    logits = torch.tensor([3.0, 2.0, 1.0, 0.0, -1.0])
    for temperature, min_p in [(1.0, 0.3), (0.5, 0.1), (2.0, 0.5), (1.0, 1.0), (1.0, 0.0)]:
        e = [2.718281828459045 ** (x / temperature) for x in logits.tolist()]
        p = [x / sum(e) for x in e]
        kept = [x if x >= min_p * max(p) else 0.0 for x in p]
        want = [x / sum(kept) for x in kept]
        got = target_probs(logits, SamplingParams(temperature=temperature, min_p=min_p))
        assert got.tolist() == pytest.approx(want, abs=1e-6), (temperature, min_p)
    gen = make_generator(0)
    draws = {sample(logits[None], [SamplingParams(min_p=0.3)], [gen])[0] for _ in range(300)}
    assert draws == {0, 1}, "e^-1 = 0.37 >= 0.3 keeps token 1; e^-2 = 0.14 drops token 2"


# ---- on the embedded model: every greedy token is the argmax of the hand-processed raw logits -------------------


@pytest.fixture
def raw_logits(monkeypatch):
    """The raw logits of every row the runner samples, as they enter its logits processing."""
    seen: list[torch.Tensor] = []
    real = model_runner.apply_logits_processors

    def spy(logits, rows):
        seen.append(logits.detach().double().cpu())
        return real(logits, rows)

    monkeypatch.setattr(model_runner, "apply_logits_processors", spy)
    return seen


REPEATING = "1 2 1 2 1 2 1 2 1 2 1 2"  # greedy goes on repeating it


@pytest.fixture(scope="module")
def prompt(llm):
    return llm.apply_chat_template("What is the capital of Japan?")  # "The capital of Japan is Tokyo." then EOS


def greedy(llm, prompt, **kwargs):
    return llm.generate(prompt, SamplingParams(temperature=0, **kwargs))[0].outputs[0]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"repetition_penalty": 1.4},
        {"frequency_penalty": 0.8},
        {"presence_penalty": 1.5, "repetition_penalty": 1.1},
        {"logit_bias": {1000: 2.0, 34: -6.0}},
        {"min_tokens": 10, "repetition_penalty": 0.8, "chat": True},
    ],
    ids=str,
)
def test_greedy_follows_the_processed_logits_step_by_step(llm, prompt, raw_logits, kwargs):
    kwargs = dict(kwargs)
    prompt = prompt if kwargs.pop("chat", False) else REPEATING
    params = SamplingParams(temperature=0, max_tokens=12, **kwargs)
    plain = greedy(llm, prompt, max_tokens=12)
    raw_logits.clear()
    out = llm.generate(prompt, params)[0].outputs[0]
    prompt_ids = llm.tokenizer.encode(prompt)
    assert len(raw_logits) == len(out.token_ids)
    for step, (raw, token) in enumerate(zip(raw_logits, out.token_ids)):
        want = reference(raw[0].tolist(), params, prompt_ids, out.token_ids[:step])
        assert token == max(range(len(want)), key=want.__getitem__), f"step {step}"
    assert out.token_ids != plain.token_ids, "the parameters change this continuation"


def test_repetition_penalty_breaks_a_repeating_greedy_continuation(llm):
    plain = greedy(llm, REPEATING, max_tokens=12)
    assert plain.text.startswith(" 1 2 1 2"), "without a penalty the model repeats"
    penalized = greedy(llm, REPEATING, max_tokens=12, repetition_penalty=1.8)
    assert not penalized.text.startswith(" 1 2 1 2")


def test_stop_token_ids_stop_at_the_token_with_vllms_finish_and_stop_reason(llm, prompt):
    plain = greedy(llm, prompt, max_tokens=20)
    k = next(i for i in range(2, len(plain.token_ids)) if plain.token_ids[i] not in plain.token_ids[:i])
    stop = plain.token_ids[k]
    out = greedy(llm, prompt, max_tokens=20, stop_token_ids=[stop, 49000])
    assert out.token_ids == plain.token_ids[: k + 1], "the stop token is kept in token_ids"
    assert (out.finish_reason, out.stop_reason) == ("stop", stop)
    assert out.text == llm.tokenizer.decode(plain.token_ids[:k]), "and left out of the text"


def test_eos_ends_with_no_stop_reason_and_ignore_eos_runs_to_max_tokens(llm, prompt):
    eos = llm.tokenizer.eos_token_id
    plain = greedy(llm, prompt, max_tokens=30)
    assert plain.token_ids[-1] == eos and (plain.finish_reason, plain.stop_reason) == ("stop", None)
    also = greedy(llm, prompt, max_tokens=30, stop_token_ids=[eos])
    assert (also.token_ids, also.stop_reason) == (plain.token_ids, None), "EOS is checked first, as in vLLM"
    out = greedy(llm, prompt, max_tokens=30, ignore_eos=True)
    assert len(out.token_ids) == 30 and out.finish_reason == "length" and eos in out.token_ids


def test_min_tokens_holds_eos_back_for_the_next_likeliest_token(llm, prompt):
    plain = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=30, logprobs=2))[0].outputs[0]
    k = len(plain.token_ids) - 1  # where the model says EOS
    runner_up = next(t for t in plain.logprobs[k] if t != plain.token_ids[k])  # its raw top-2, EOS aside
    out = greedy(llm, prompt, max_tokens=30, min_tokens=k + 4)
    assert out.token_ids[:k] == plain.token_ids[:k] and out.token_ids[k] == runner_up
    assert llm.tokenizer.eos_token_id not in out.token_ids[: k + 4]


def test_stop_strings_wait_for_min_tokens(llm, prompt):
    early = greedy(llm, prompt, max_tokens=30, stop="Japan", min_tokens=3)
    assert (early.text, early.stop_reason) == ("The capital of ", "Japan")
    late = greedy(llm, prompt, max_tokens=30, stop="Japan", min_tokens=4)  # "Japan" ends in token 4: too early
    assert late.text.startswith("The capital of Japan is") and late.stop_reason is None


def test_logit_bias_forces_and_bans_tokens(llm, prompt):
    assert greedy(llm, prompt, max_tokens=5, logit_bias={1000: 100}).token_ids == [1000] * 5
    plain = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=1, logprobs=2))[0].outputs[0]
    first, runner_up = plain.token_ids[0], next(t for t in plain.logprobs[0] if t != plain.token_ids[0])
    banned = greedy(llm, prompt, max_tokens=1, logit_bias={str(first): -1e9})  # JSON's keys; clipped to -100
    assert banned.token_ids == [runner_up]


def test_penalties_and_min_tokens_give_the_same_greedy_tokens_under_speculative_decoding(llm):
    spec = LLM(
        progress=False,
        kv_cache_memory_bytes=64 * 2**20,
        speculative_config={"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1},
    )
    prompt = "1 2 3 1 2 3 1 2 3 1 2 3 1 2 3"
    for kwargs in [
        {"repetition_penalty": 1.2},
        {"frequency_penalty": 0.4, "presence_penalty": 0.2},
        {"min_tokens": 12, "stop_token_ids": [28]},
    ]:
        params = SamplingParams(temperature=0, max_tokens=16, **kwargs)
        want = llm.generate(prompt, params)[0].outputs[0]
        got = spec.generate(prompt, params)[0].outputs[0]
        assert (got.token_ids, got.finish_reason, got.stop_reason) == (
            want.token_ids,
            want.finish_reason,
            want.stop_reason,
        ), kwargs
    assert spec.get_stats().num_draft_tokens > 0
    for kwargs in [{"min_p": 0.1}, {"logit_bias": {3: 1.0}}]:
        (name,) = kwargs
        with pytest.raises(InvalidRequestError, match=f"{name} is not supported with speculative") as info:
            spec.generate(prompt, SamplingParams(**kwargs))
        assert info.value.parameter == name
    greedy_min_p = spec.generate(prompt, SamplingParams(temperature=0, max_tokens=2, min_p=0.5))[0]
    assert len(greedy_min_p.token_ids) == 2, "vLLM lets greedy keep a min_p it never reads"


# ---- validation ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs,parameter",
    [
        ({"min_p": -0.1}, "min_p"),
        ({"min_p": 1.5}, "min_p"),
        ({"min_p": float("nan")}, "min_p"),
        ({"presence_penalty": 2.5}, "presence_penalty"),
        ({"presence_penalty": -2.01}, "presence_penalty"),
        ({"frequency_penalty": 3}, "frequency_penalty"),
        ({"frequency_penalty": float("inf")}, "frequency_penalty"),
        ({"repetition_penalty": 0}, "repetition_penalty"),
        ({"repetition_penalty": -1.0}, "repetition_penalty"),
        ({"repetition_penalty": float("inf")}, "repetition_penalty"),
        ({"repetition_penalty": "1.2"}, "repetition_penalty"),
        ({"min_tokens": -1}, "min_tokens"),
        ({"min_tokens": 17}, "min_tokens"),  # above max_tokens=16
        ({"min_tokens": 2.0}, "min_tokens"),
        ({"stop_token_ids": [1, "2"]}, "stop_token_ids"),
        ({"stop_token_ids": 7}, "stop_token_ids"),
        ({"stop_token_ids": [True]}, "stop_token_ids"),
        ({"logit_bias": {"x": 1.0}}, "logit_bias"),
        ({"logit_bias": {1: float("nan")}}, "logit_bias"),
        ({"logit_bias": {1: "big"}}, "logit_bias"),
        ({"logit_bias": [(1, 2.0)]}, "logit_bias"),
    ],
    ids=str,
)
def test_invalid_values_raise_the_documented_error_naming_the_field(kwargs, parameter):
    with pytest.raises(InvalidRequestError, match=parameter) as info:
        SamplingParams(**kwargs)
    assert info.value.parameter == parameter


OUT_OF_RANGE = {
    "min_p": st.one_of(st.floats(max_value=-1e-9), st.floats(min_value=1 + 1e-9), st.just(float("nan"))),
    "presence_penalty": st.one_of(st.floats(max_value=-2.000001), st.floats(min_value=2.000001)),
    "frequency_penalty": st.one_of(st.floats(max_value=-2.000001), st.floats(min_value=2.000001)),
    "repetition_penalty": st.one_of(st.floats(max_value=0.0), st.just(float("inf"))),
    "min_tokens": st.one_of(st.integers(max_value=-1), st.integers(min_value=17)),
}


@settings(max_examples=300, deadline=None)
@given(data=st.data(), name=st.sampled_from(sorted(OUT_OF_RANGE)))
def test_any_out_of_range_value_is_refused_by_name(data, name):
    value = data.draw(OUT_OF_RANGE[name])
    with pytest.raises(InvalidRequestError) as info:
        SamplingParams(**{name: value})
    assert info.value.parameter == name and name in str(info.value)


def test_values_are_normalized_as_vllm_does():
    p = SamplingParams(stop_token_ids=[7, 3, 7], logit_bias={"12": 500, 4: -0.5})
    assert p.stop_token_ids == [7, 3] and p.logit_bias == {12: 100.0, 4: -0.5}


def test_the_engine_checks_token_ids_against_the_vocabulary(llm):
    vocab = llm.config.vocab_size
    for kwargs in [{"stop_token_ids": [vocab]}, {"stop_token_ids": [-1]}, {"logit_bias": {vocab + 5: 1.0}}]:
        (name,) = kwargs
        with pytest.raises(InvalidRequestError, match=rf"{name} has token id.*\[0, {vocab}\)") as info:
            llm.generate("Hi", SamplingParams(**kwargs))
        assert info.value.parameter == name
    assert not llm.engine.has_unfinished_requests()


# ---- what nanoengine does not take -------------------------------------------------------------------------------

NOT_DEFAULT = {
    "watermarking": True,
    "flat_logprobs": True,
    "detokenize": False,
    "skip_special_tokens": False,
    "spaces_between_special_tokens": False,
    "include_stop_str_in_output": True,
    "skip_clone": "yes",
    "bad_words": ["foo"],
    "thinking_token_budget": 100,
    "routed_experts_prompt_start": 3,
    "best_of": 3,
    "use_beam_search": True,
}


@pytest.mark.parametrize("name", sorted(UNSUPPORTED))
def test_every_unsupported_vllm_field_is_refused_by_name(name):
    value = NOT_DEFAULT.get(name, {"something": 1})
    with pytest.raises(InvalidRequestError, match=f"does not support {name}") as info:
        SamplingParams(**{name: value})
    assert info.value.parameter == name
    for default in UNSUPPORTED[name][0]:
        SamplingParams(**{name: default})  # vLLM's default asks for nothing nanoengine does not do


def test_an_unknown_keyword_is_refused_with_the_closest_name():
    with pytest.raises(InvalidRequestError, match="unknown argument temprature. Did you mean temperature") as info:
        SamplingParams(temprature=0.5)
    assert info.value.parameter == "temprature" and not isinstance(info.value, TypeError)


def test_generate_and_chat_refuse_unknown_and_unsupported_keywords(llm):
    with pytest.raises(InvalidRequestError, match="Did you mean use_tqdm") as info:
        llm.generate("Hi", use_tdqm=False)
    assert info.value.parameter == "use_tdqm"
    with pytest.raises(InvalidRequestError, match="does not support lora_request.*LoRA"):
        llm.generate("Hi", lora_request=object())
    with pytest.raises(InvalidRequestError, match="does not support chat_template"):
        llm.chat("Hi", chat_template="{{ messages }}")
    assert not llm.engine.has_unfinished_requests()


def test_use_tqdm_shows_or_silences_the_progress_bar(llm, capsys):
    params = SamplingParams(temperature=0, max_tokens=2)
    llm.generate("Hi", params, use_tqdm=False)
    assert "Generating" not in capsys.readouterr().err
    llm.generate("Hi", params, use_tqdm=True)
    assert "Generating" in capsys.readouterr().err
    made = []

    def bar(**kwargs):
        from tqdm import tqdm

        made.append(kwargs)
        return tqdm(disable=True, **kwargs)

    llm.chat("Hi", params, use_tqdm=functools.partial(bar))
    assert made and made[0]["total"] == 1
    with pytest.raises(InvalidRequestError, match="use_tqdm must be") as info:
        llm.generate("Hi", params, use_tqdm="yes")
    assert info.value.parameter == "use_tqdm"
