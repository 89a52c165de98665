"""N-gram speculative decoding: drafts are proposed, verified in one forward pass and never change the output.

Greedy outputs with speculation equal those without it (and HF's) whatever chunking, preemption, prefix hits,
n, logprobs, stop strings or max_tokens do; sampled outputs keep the model's distribution (a statistical test
on a tiny model, and the rejection sampler against the exact distribution); a hypothesis machine checks after
every step that no cached block holds a token that is not verified, and that nothing leaks.
"""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from nanoengine import LLM, SamplingParams
from nanoengine.config import LlamaConfig
from nanoengine.core import KVCacheManager, get_request_block_hasher, make_block_hash_with_group_id
from nanoengine.core.sched.scheduler import Scheduler, SchedulerConfig
from nanoengine.errors import InvalidEngineArgumentError
from nanoengine.model import LlamaForCausalLM
from nanoengine.request import Request, RequestStatus
from nanoengine.sample.rejection_sampler import rejection_sample
from nanoengine.sample.sampler import target_probs
from nanoengine.spec_decode.ngram_proposer import find_longest_matched_ngram_and_propose_tokens
from nanoengine.worker.outputs import ModelRunnerOutput

SPEC = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 4}
TINY = LlamaForCausalLM.random(LlamaConfig.tiny(vocab_size=16), seed=0, std=0.2)
BS = 4


def tiny_llm(spec=SPEC, **kwargs) -> LLM:
    args = {"block_size": BS, "num_gpu_blocks_override": 64, "max_num_seqs": 8, "progress": False}
    return LLM(TINY, **(args | kwargs), speculative_config=spec)


def assert_no_leak(llm: LLM) -> None:
    pool = llm.engine.kv_cache_manager.block_pool
    assert pool.get_num_free_blocks() == llm.kv_cache.num_blocks - 1, "every non-null block is back"
    assert not llm.engine.has_unfinished_requests()


# ---- the argument -----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "bad",
    [
        {"method": "eagle", "num_speculative_tokens": 2},
        {"method": "ngram", "num_speculative_tokens": 0},
        {"method": "ngram", "num_speculative_tokens": 2.0},
        {"method": "ngram", "num_speculative_tokens": True},
        {"method": "ngram"},
        {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 4, "prompt_lookup_max": 2},
        {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 0},
        {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": "3"},
        {"method": "ngram", "num_speculative_tokens": 2, "draft_model": "x"},
        "ngram",
        [("method", "ngram")],
    ],
)
def test_bad_speculative_config_is_refused_by_name(bad):
    with pytest.raises(InvalidEngineArgumentError, match="speculative_config") as info:
        tiny_llm(bad)
    assert info.value.parameter == "speculative_config"


def test_speculative_config_defaults_are_vllms():
    assert tiny_llm(None).engine.proposer is None, "off by default"
    config = tiny_llm({"method": "ngram", "num_speculative_tokens": 3}).speculative_config
    assert (config.prompt_lookup_min, config.prompt_lookup_max) == (5, 5)
    config = tiny_llm({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3}).speculative_config
    assert (config.prompt_lookup_min, config.prompt_lookup_max) == (3, 3)
    config = tiny_llm({"num_speculative_tokens": 3, "prompt_lookup_min": 2}).speculative_config
    assert (config.method, config.prompt_lookup_min, config.prompt_lookup_max) == ("ngram", 2, 2)


# ---- the proposer -----------------------------------------------------------------------------------------
def vllm_reference(tokens: list[int], min_ngram: int, max_ngram: int, max_model_len: int, k: int) -> list[int]:
    """vLLM 0.33's _find_longest_matched_ngram_and_propose_tokens (vllm/v1/spec_decode/ngram_proposer.py),
    transcribed line by line: a KMP scan of the reversed tokens."""
    total = len(tokens)
    if total < min_ngram:
        return []
    k = min(k, max_model_len - total)
    if k <= 0:
        return []
    rev = tokens[::-1]
    lps = [0] * max_ngram
    longest, position, prev, i = 0, 0, 0, 1
    while i < total:
        if rev[prev] == rev[i]:
            prev += 1
            if prev >= longest:
                longest, position = prev, i
            if i < max_ngram:
                lps[i] = prev
            if prev == max_ngram:
                prev = lps[max_ngram - 1]
            i += 1
        elif prev != 0:
            prev = lps[prev - 1]
        else:
            i += 1
    if longest < min_ngram:
        return []
    start = total - 1 - position + longest
    return tokens[start : start + min(k, total - start)]


@settings(max_examples=400, deadline=None)
@given(
    tokens=st.lists(st.integers(0, 3), max_size=40),
    lo=st.integers(1, 4),
    span=st.integers(0, 3),
    k=st.integers(1, 6),
    room=st.integers(-2, 8),
)
def test_proposer_follows_vllms_rule(tokens, lo, span, k, room):
    args = (tokens, lo, lo + span, len(tokens) + room, k)
    assert find_longest_matched_ngram_and_propose_tokens(*args) == vllm_reference(*args)


def test_proposer_examples():
    # The longest n-gram wins, and of its occurrences the earliest.
    assert find_longest_matched_ngram_and_propose_tokens([1, 2, 3, 9, 2, 3, 7, 1, 2, 3], 1, 3, 100, 2) == [9, 2]
    assert find_longest_matched_ngram_and_propose_tokens([5, 2, 3, 8, 2, 3], 2, 2, 100, 3) == [8, 2, 3]
    # Up to the end of the context, and never past max_model_len.
    assert find_longest_matched_ngram_and_propose_tokens([1, 2, 1, 2], 2, 2, 100, 5) == [1, 2]
    assert find_longest_matched_ngram_and_propose_tokens([1, 2, 7, 7, 1, 2], 2, 2, 8, 5) == [7, 7]
    assert find_longest_matched_ngram_and_propose_tokens([1, 2, 7, 7, 1, 2], 2, 2, 6, 5) == []
    assert find_longest_matched_ngram_and_propose_tokens([1, 2, 3], 2, 3, 100, 5) == [], "no earlier match"


# ---- the rejection sampler --------------------------------------------------------------------------------
def test_greedy_verification_accepts_the_prefix_that_equals_the_argmax():
    logits = torch.full((4, 8), -5.0)
    for row, best in enumerate([3, 5, 6, 1]):
        logits[row, best] = 5.0
    greedy = [SamplingParams(temperature=0)]
    assert rejection_sample(logits, [[3, 5, 6]], greedy, [None]) == [[3, 5, 6, 1]], "all accepted, then the bonus"
    assert rejection_sample(logits, [[3, 4, 6]], greedy, [None]) == [[3, 5]], "the argmax at the first mismatch"
    assert rejection_sample(logits[:3], [[2], []], greedy * 2, [None] * 2) == [[3], [6]], "row by row"


def total_variation(counts: Counter, probs: torch.Tensor, n: int) -> float:
    return 0.5 * sum(abs(counts.get(t, 0) / n - float(p)) for t, p in enumerate(probs))


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=1.0),
        SamplingParams(temperature=0.7, top_k=4),
        SamplingParams(temperature=1.3, top_p=0.8),
    ],
)
@pytest.mark.parametrize("draft", [0, 2, 5])
def test_rejection_sampler_keeps_the_target_distribution(params, draft):
    """Whatever the forced draft (likely, unlikely, or outside top-k/top-p), the first token emitted is
    distributed as p, the filtered target distribution; after an accepted draft, the next one as p of row 2."""
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 6, generator=gen) * 1.5
    n = 6000
    runs = [rejection_sample(logits, [[draft]], [params], [gen])[0] for _ in range(n)]
    first = Counter(run[0] for run in runs)
    assert total_variation(first, target_probs(logits[0], params), n) < 0.03
    accepted = [run[1] for run in runs if run[0] == draft and len(run) == 2]
    if len(accepted) > 1000:
        assert total_variation(Counter(accepted), target_probs(logits[1], params), len(accepted)) < 0.05


def test_sampled_outputs_keep_the_models_distribution():
    """A tiny model of 16 tokens, a repetitive prompt (drafts almost every step), 3 tokens per request, seeded:
    each position's token frequencies over 3,000 requests are within sampling noise of the exact marginal,
    computed from the model's full softmax over every prefix."""
    model = LlamaForCausalLM.random(LlamaConfig.tiny(vocab_size=8), seed=3, std=0.1)
    prompt = [3, 4, 5, 3, 4, 5, 3, 4, 5, 3]
    spec = {"num_speculative_tokens": 2, "prompt_lookup_min": 1, "prompt_lookup_max": 2}
    llm = LLM(
        model,
        block_size=BS,
        max_num_seqs=512,
        max_num_batched_tokens=4096,
        max_logprobs=-1,
        progress=False,
        speculative_config=spec,
    )
    n = 3000
    params = [SamplingParams(temperature=1.0, max_tokens=3, ignore_eos=True, seed=i) for i in range(n)]
    outs = llm.generate(prompt_token_ids=[prompt] * n, sampling_params=params)
    stats = llm.get_stats()
    assert 0 < stats.num_accepted_tokens < stats.num_draft_tokens, "both acceptance and rejection were exercised"

    exact = LLM(model, block_size=BS, max_logprobs=-1, progress=False)
    full = SamplingParams(temperature=0, max_tokens=1, logprobs=-1)

    def next_probs(prefixes: list[list[int]]) -> list[torch.Tensor]:
        outs = exact.generate(prompt_token_ids=[prompt + p for p in prefixes], sampling_params=full)
        return [torch.tensor([math.exp(o.outputs[0].logprobs[0][t].logprob) for t in range(8)]) for o in outs]

    # The exact joint law of (t1, t2, t3), position by position: P(prefix) * p(next | prefix).
    law = {(): 1.0}
    for position in range(3):
        prefixes = list(law)
        probs = next_probs([list(p) for p in prefixes])
        law = {p + (t,): law[p] * float(q[t]) for p, q in zip(prefixes, probs) for t in range(8)}
        marginal = torch.zeros(8)
        for p, mass in law.items():
            marginal[p[-1]] += mass
        counts = Counter(o.outputs[0].token_ids[position] for o in outs)
        assert total_variation(counts, marginal, n) < 0.04, f"position {position + 1}"


# ---- the scheduler, without a model -------------------------------------------------------------------------
def scheduler(**cfg) -> Scheduler:
    return Scheduler(SchedulerConfig(**cfg), KVCacheManager(BS, 64))


def decoding(s: Scheduler, rid="a", prompt=(1, 2, 3, 4, 5), max_tokens=20) -> Request:
    """A request past its prefill, with one sampled token (9) and num_computed_tokens = num_tokens - 1."""
    request = Request(
        rid,
        list(prompt),
        sampling_params=SamplingParams(max_tokens=max_tokens),
        eos_token_id=0,
        block_hasher=get_request_block_hasher(BS),
    )
    s.add_request(request)
    so = s.schedule()
    s.update_from_output(so, ModelRunnerOutput({rid: [9]}))
    return request


def test_drafts_are_scheduled_inside_the_budget_and_max_model_len():
    s = scheduler(max_num_batched_tokens=4)
    request = decoding(s, prompt=(1, 2, 3, 4))  # a prompt the budget takes whole: decoding after one step
    s.update_draft_token_ids({"a": [7, 7, 7, 7, 7]})
    assert request.num_tokens_with_spec == request.num_tokens + 5
    so = s.schedule()
    assert so.num_scheduled_tokens == {"a": 4} and so.scheduled_spec_decode_tokens == {"a": [7, 7, 7]}
    assert request.spec_token_ids == [] and request.num_computed_tokens == request.num_tokens + 3

    s = scheduler(max_model_len=9)  # 6 tokens: the step may emit 3 more at most
    request = decoding(s)
    s.update_draft_token_ids({"a": [7, 7, 7, 7]})
    so = s.schedule()
    assert so.num_scheduled_tokens == {"a": 3} and so.scheduled_spec_decode_tokens == {"a": [7, 7]}


def test_rejected_drafts_roll_back_and_a_stop_drops_the_rest():
    s = scheduler()
    request = decoding(s)
    s.update_draft_token_ids({"a": [7, 8, 9]})
    so = s.schedule()
    s.update_from_output(so, ModelRunnerOutput({"a": [7, 6]}))  # d1 accepted, d2 rejected: 6 recovered
    assert request.output_token_ids == [9, 7, 6]
    assert request.num_computed_tokens == request.num_tokens - 1, "the rejected drafts' slots are free again"
    # allocate_slots cached up to the 6 verified tokens (1 block), not the 9 with drafts (2 blocks).
    assert s.kv_cache_manager.coordinator.single_type_managers[0].num_cached_block == {"a": 1}

    s.update_draft_token_ids({"a": [5, 0, 5]})
    so = s.schedule()
    finished = s.update_from_output(so, ModelRunnerOutput({"a": [5, 0, 5, 4]}))  # EOS (0) mid-run
    assert finished == [request] and request.status is RequestStatus.FINISHED_STOPPED
    assert request.output_token_ids == [9, 7, 6, 5, 0]

    s = scheduler()
    request = decoding(s, max_tokens=3)
    s.update_draft_token_ids({"a": [5, 5]})
    so = s.schedule()
    s.update_from_output(so, ModelRunnerOutput({"a": [5, 5, 5]}))  # max_tokens lands mid-run
    assert request.output_token_ids == [9, 5, 5] and request.status is RequestStatus.FINISHED_LENGTH_CAPPED


def test_preemption_clears_drafts():
    s = scheduler()
    request = decoding(s)
    s.update_draft_token_ids({"a": [7, 7]})
    s.running.remove(request)
    s.preempt(request)
    assert request.spec_token_ids == [] and request.num_tokens_with_spec == request.num_tokens


# ---- the engine on the real model ---------------------------------------------------------------------------
QUOTE = (
    "The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs. "
    "How vexingly quick daft zebras jump!"
)
ASKS = [
    f"Repeat this text exactly, twice: {QUOTE}",
    "Complete the code:\ndef add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef mul(a, b):",
    "What is the capital of Japan?",
]
SPEC_REAL = {"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_min": 2, "prompt_lookup_max": 4}
GREEDY = SamplingParams(temperature=0, max_tokens=32)


@pytest.fixture(scope="module")
def chat_prompts(llm):
    return [llm.apply_chat_template(q) for q in ASKS]


@pytest.fixture(scope="module")
def plain(llm, chat_prompts):
    """Speculation off: the outputs every configuration with it on must equal."""
    return llm.generate(chat_prompts, SamplingParams(temperature=0, max_tokens=32, logprobs=2))


@pytest.fixture(scope="module")
def spec_llm(llm):
    return LLM(progress=False, speculative_config=SPEC_REAL)


@pytest.mark.model
@pytest.mark.reference
def test_greedy_with_speculation_equals_without_and_hf(spec_llm, chat_prompts, plain, hf_model):
    outs = spec_llm.generate(chat_prompts, SamplingParams(temperature=0, max_tokens=32, logprobs=2))
    stats = spec_llm.get_stats()
    assert stats.num_accepted_tokens > 20 and stats.num_steps < 32, "the repetitive prompts accept many drafts"
    for prompt, out, ref in zip(chat_prompts, outs, plain):
        assert out.token_ids == ref.token_ids and out.text == ref.text
        for got, want in zip(out.outputs[0].logprobs, ref.outputs[0].logprobs):
            assert got.keys() == want.keys() and all(abs(got[t].logprob - want[t].logprob) < 1e-3 for t in got)
        assert out.outputs[0].cumulative_logprob == pytest.approx(ref.outputs[0].cumulative_logprob, abs=1e-2)
        ids = spec_llm.tokenizer.encode(prompt)
        with torch.no_grad():
            hf = hf_model.generate(torch.tensor([ids]), max_new_tokens=32, do_sample=False, pad_token_id=2)
        assert out.token_ids == hf[0, len(ids) :].tolist()[: len(out.token_ids)]
    again = spec_llm.generate(chat_prompts, GREEDY)
    assert all(o.num_cached_tokens > 0 for o in again), "prefix-cache hits"
    assert [o.token_ids for o in again] == [o.token_ids for o in plain]
    assert_no_leak(spec_llm)


@pytest.mark.model
@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_num_batched_tokens": 8},  # chunked prefill, and drafts cut by the budget
        {"num_gpu_blocks_override": 40, "block_size": 4},  # 156 tokens: prompts of 67 and 70 fit, not their growth
    ],
    ids=["chunked", "preempted"],
)
def test_greedy_with_speculation_survives_chunking_and_preemption(chat_prompts, plain, kwargs):
    llm = LLM(progress=False, speculative_config=SPEC_REAL, **kwargs)
    outs = llm.generate(chat_prompts, GREEDY)
    assert [o.token_ids for o in outs] == [o.token_ids for o in plain]
    assert llm.get_stats().num_accepted_tokens > 0
    if "num_gpu_blocks_override" in kwargs:
        assert llm.get_stats().num_preemptions > 0
    assert_no_leak(llm)


@pytest.mark.model
def test_n_stop_strings_and_max_tokens_mid_run(spec_llm, llm, chat_prompts, plain):
    outs = spec_llm.generate(chat_prompts[0], SamplingParams(temperature=0, max_tokens=32, n=2))[0]
    assert [c.token_ids for c in outs.outputs] == [plain[0].token_ids] * 2
    # A stop string inside a run of accepted drafts: the text ends before it and the tokens at the one that
    # completed it, as without speculation.
    stop = SamplingParams(temperature=0, max_tokens=32, stop=["lazy dog. Pack"])
    for p in (stop, SamplingParams(temperature=0, max_tokens=13)):
        got, want = spec_llm.generate(chat_prompts[0], p)[0], llm.generate(chat_prompts[0], p)[0]
        assert (got.text, got.token_ids, got.finish_reason, got.outputs[0].stop_reason) == (
            want.text,
            want.token_ids,
            want.finish_reason,
            want.outputs[0].stop_reason,
        )
    assert got.finish_reason == "length" and len(got.token_ids) == 13
    pieces = list(spec_llm.stream(chat_prompts[0], GREEDY))
    assert "".join(pieces) == plain[0].text and len(pieces) < len(plain[0].token_ids), "several tokens a piece"
    assert_no_leak(spec_llm)


# ---- every step, under random workloads -------------------------------------------------------------------
class SpecDecodeMachine(RuleBasedStateMachine):
    """A tiny model, a small pool and a small budget, speculation on; requests come, run, finish and are
    aborted at random. After every step: every block a request holds is cached only if all its tokens are
    verified tokens of that request (its hash is the chain hash of the request's verified tokens, recomputed
    here, and it lies below num_tokens); num_computed_tokens stays below num_tokens. At the end every greedy
    request that finished equals the same request run without speculation, and no block is held."""

    def __init__(self):
        super().__init__()
        self.outputs, self.greedy, self.aborted = {}, {}, set()

    @initialize(
        num_blocks=st.sampled_from([10, 16, 40]),
        budget=st.sampled_from([3, 8, 32]),
        k=st.integers(1, 5),
        caching=st.booleans(),
    )
    def build(self, num_blocks, budget, k, caching):
        self.llm = LLM(
            TINY,
            block_size=BS,
            num_gpu_blocks_override=num_blocks,
            max_num_batched_tokens=max(budget, 1 + k),  # a padded step of 1 + k must fit (EngineConfig)
            max_num_seqs=4,
            enable_prefix_caching=caching,
            progress=False,
            speculative_config={"num_speculative_tokens": k, "prompt_lookup_min": 1, "prompt_lookup_max": 3},
        )
        self.engine = self.llm.engine
        self.hasher = get_request_block_hasher(BS)

    @rule(
        prompt=st.lists(st.integers(3, 6), min_size=1, max_size=14),
        max_tokens=st.integers(1, 16),
        sampled=st.booleans(),
    )
    def add(self, prompt, max_tokens, sampled):
        if len(prompt) + 1 > self.llm.num_kv_tokens:
            return
        params = SamplingParams(temperature=0.8 if sampled else 0, max_tokens=max_tokens, seed=len(self.outputs))
        req_id = self.engine.add_request(prompt, params)
        self.outputs[req_id] = None
        if not sampled:
            self.greedy[req_id] = (prompt, params)

    @rule()
    def step(self):
        if self.engine.has_unfinished_requests():
            for out in self.engine.step():
                self.outputs[out.request_id] = out

    @rule(data=st.data())
    def abort(self, data):
        running = sorted(self.engine.outputs)
        if running:
            req_id = data.draw(st.sampled_from(running))
            self.engine.abort_request([req_id])
            self.aborted.add(req_id)

    @invariant()
    def only_verified_tokens_are_cached(self):
        if not hasattr(self, "engine"):
            return
        manager = self.engine.kv_cache_manager.coordinator.single_type_managers[0]
        for req_id, request in self.engine.scheduler.requests.items():
            if request.status is not RequestStatus.RUNNING:
                continue
            assert request.num_computed_tokens < request.num_tokens
            assert manager.num_cached_block[req_id] * BS <= request.num_tokens, "a draft's block was cached"
            verified = Request("check", request.all_token_ids, block_hasher=self.hasher).block_hashes
            for i, block in enumerate(manager.req_to_blocks[req_id][: manager.num_cached_block[req_id]]):
                if block.block_hash is not None:
                    assert block.block_hash == make_block_hash_with_group_id(verified[i], 0)

    def teardown(self):
        if not hasattr(self, "engine"):
            return
        while self.engine.has_unfinished_requests():
            self.step()
        assert_no_leak(self.llm)
        done = [r for r in self.greedy if r not in self.aborted]
        if done:
            plain = LLM(TINY, block_size=BS, progress=False)
            want = plain.generate(
                prompt_token_ids=[self.greedy[r][0] for r in done], sampling_params=[self.greedy[r][1] for r in done]
            )
            assert [self.outputs[r].token_ids for r in done] == [w.token_ids for w in want]


SpecDecodeMachine.TestCase.settings = settings(max_examples=25, stateful_step_count=30, deadline=None)
TestSpecDecodeMachine = SpecDecodeMachine.TestCase


# ---- the GPU ------------------------------------------------------------------------------------------------
@pytest.mark.gpu
def test_gpu_verify_steps_run_eagerly():
    """CUDA graphs replay pure-decode steps only: a step that verifies drafts runs eagerly and is not counted
    in num_replays, and the greedy output is the one without speculation."""
    model = LlamaForCausalLM.random(LlamaConfig.smollm2_135m(), std=0.02, device="cuda", dtype=torch.float32)
    prompt = [[5, 6, 7, 8] * 6]
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    plain = LLM(model, kv_cache_memory_bytes=2**30, progress=False)
    want = plain.generate(prompt_token_ids=prompt, sampling_params=params)[0].token_ids
    llm = LLM(model, kv_cache_memory_bytes=2**30, progress=False, speculative_config=SPEC)
    got = llm.generate(prompt_token_ids=prompt, sampling_params=params)[0].token_ids
    stats = llm.get_stats()
    assert got == want and stats.num_drafts > 0
    assert llm.engine.runner.cuda_graphs.num_replays == stats.num_steps - 1 - stats.num_drafts


@pytest.mark.parametrize(
    "params", [SamplingParams(max_tokens=6, temperature=0.0), SamplingParams(max_tokens=6, seed=3)]
)
def test_a_padded_step_samples_as_a_step_without_drafts(params):
    """A request admitted with one token left (here a prefix hit of all but its last token) is padded to 1 + k with
    placeholder drafts (vLLM 0.33's uniform decode batch). The runner feeds them as token 0 and accepts none: the
    output equals that of a run without speculation, greedy or seeded."""
    prompt = [3, 1, 4, 1, 5, 9, 2, 6, 5]  # 2 blocks of 4 and one token
    llm = tiny_llm()
    scheduled: list[dict[str, list[int]]] = []
    schedule = llm.engine.scheduler.schedule

    def recording():
        out = schedule()
        scheduled.append(dict(out.scheduled_spec_decode_tokens))
        return out

    llm.engine.scheduler.schedule = recording
    first = llm.generate(prompt_token_ids=[prompt], sampling_params=params)[0].outputs[0].token_ids
    del scheduled[:]
    again = llm.generate(prompt_token_ids=[prompt], sampling_params=params)[0].outputs[0].token_ids
    assert list(scheduled[0].values()) == [[-1] * SPEC["num_speculative_tokens"]], scheduled[0]
    plain = LLM(TINY, block_size=BS, num_gpu_blocks_override=64, progress=False)
    expected = plain.generate(prompt_token_ids=[prompt], sampling_params=params)[0].outputs[0].token_ids
    assert first == again == expected
    assert_no_leak(llm)
