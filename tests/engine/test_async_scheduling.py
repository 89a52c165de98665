"""Async scheduling (vLLM 0.33's default) against synchronous steps: for greedy requests the outputs are identical,
token for token, on random workloads with preemption (a small pool), aborts mid-run, requests arriving mid-run,
stop strings, EOS, max_tokens=1, logprobs, n > 1 and sliding-window layers; and what it cannot run is refused."""

import random

import pytest
from tiny_gguf import hf_state_dict, tiny_vocab, write_tiny_llama_gguf

from nanoengine.config import LlamaConfig
from nanoengine.core.sched.async_scheduler import AsyncScheduler
from nanoengine.core.sched.scheduler import Scheduler
from nanoengine.engine.arg_utils import ASYNC_DEFAULT
from nanoengine.entrypoints.llm import LLM
from nanoengine.errors import InvalidEngineArgumentError
from nanoengine.model import LlamaForCausalLM
from nanoengine.sampling_params import SamplingParams

BLOCK_SIZE = 4
VOCAB = len(tiny_vocab())
STOPS = ["e", "th", "Ġ", "?!"]  # single characters and pairs of the tiny vocabulary's text


@pytest.fixture(scope="module", params=["full", "hybrid"])
def model(request, tmp_path_factory):
    """A random tiny model with a tokenizer (so stop strings and EOS work): full attention, or three sliding
    layers to one full (sliding blocks are freed behind the processed tokens), whose four KV cache groups share
    the pool: its path and how many blocks a workload's one block stands for."""
    if request.param == "full":
        config = LlamaConfig.tiny(vocab_size=VOCAB)
    else:
        config = LlamaConfig.tiny_hybrid(2 * BLOCK_SIZE, vocab_size=VOCAB)
    model = LlamaForCausalLM.random(config, seed=3, std=0.2)
    folder = tmp_path_factory.mktemp(request.param)
    return write_tiny_llama_gguf(folder / "model.gguf", config, hf_state_dict(model)), 1 + 2 * bool(config.layer_types)


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("NANOENGINE_CACHE", str(tmp_path / "cache"))


def engine_llm(path, async_scheduling: bool, num_blocks: int, **kwargs) -> LLM:
    return LLM(
        model=path,
        block_size=BLOCK_SIZE,
        num_gpu_blocks_override=num_blocks,
        async_scheduling=async_scheduling,
        progress=False,
        **kwargs,
    )


def random_workload(seed: int) -> dict:
    """Requests (prompt, SamplingParams, the step it arrives at), the steps at which some are aborted, and the
    engine's pool and budget: small enough that requests are preempted."""
    rng = random.Random(seed)
    family = [rng.randrange(3, VOCAB) for _ in range(12)]  # a shared prefix, so prefix caching has work to do
    requests = []
    for _ in range(rng.randint(3, 8)):
        prompt = family[: rng.choice([0, 4, 8, 12])] + [rng.randrange(3, VOCAB) for _ in range(rng.randint(1, 14))]
        params = SamplingParams(
            temperature=0,
            max_tokens=rng.choice([1, 2, 5, 9, 16]),
            ignore_eos=rng.random() < 0.5,
            stop=rng.sample(STOPS, rng.randint(1, 2)) if rng.random() < 0.4 else None,
            logprobs=2 if rng.random() < 0.3 else None,
        )
        requests.append((prompt, params, rng.choice([0, 0, 0, 1, 3, 6])))
    aborts = {rng.randrange(len(requests)): rng.randint(1, 8) for _ in range(rng.randint(0, 2))}
    engine_args = {
        "num_blocks": rng.randint(10, 24),
        "max_num_batched_tokens": rng.choice([8, 16, 64]),
        "long_prefill_token_threshold": rng.choice([0, 4]),
        "scheduling_policy": rng.choice(["fcfs", "priority"]),
    }
    return {"requests": requests, "aborts": aborts, "engine_args": engine_args}


def run(model, workload: dict, async_scheduling: bool) -> tuple[dict, int]:
    """Drive the engine step by step: arrivals and aborts happen at given engine steps. Returns each finished
    request's (token ids, text, finish and stop reason, logprobs) by its index, and the preemptions."""
    path, scale = model
    engine_args = {**workload["engine_args"], "num_blocks": workload["engine_args"]["num_blocks"] * scale}
    llm = engine_llm(path, async_scheduling, **engine_args)
    engine, ids, outputs, step = llm.engine, {}, {}, 0
    pending = list(enumerate(workload["requests"]))
    while pending or engine.has_unfinished_requests():
        for i, (prompt, params, arrival) in list(pending):
            if arrival <= step:
                ids[engine.add_request(prompt, params, priority=i % 3)] = i
                pending.remove((i, (prompt, params, arrival)))
        engine.abort_request([r for r, i in ids.items() if workload["aborts"].get(i) == step])
        for out in engine.step():
            c = out.outputs[0]
            logprobs = c.logprobs and [{t: (lp.logprob, lp.rank) for t, lp in e.items()} for e in c.logprobs]
            outputs[ids[out.request_id]] = (c.token_ids, c.text, c.finish_reason, c.stop_reason, logprobs)
        step += 1
        assert step < 500, "the engine made no progress"
    kv = engine.kv_cache_manager
    assert kv.block_pool.get_num_free_blocks() == engine_args["num_blocks"] - 1, "blocks leaked"
    assert not engine.batch_queue
    return outputs, llm.get_stats().num_preemptions


def assert_same(got: dict, expected: dict, aborted: set[int]) -> None:
    """The same requests finished with the same tokens, text and reasons; logprobs equal to float rounding (the
    batches differ, so a matmul may sum in another order). An aborted request may finish before its abort in
    one mode and not the other; when both finish it, they agree."""
    assert set(got) - aborted == set(expected) - aborted
    for i in set(got) & set(expected):
        (*tokens, logprobs), (*want, want_logprobs) = got[i], expected[i]
        assert tokens == want, f"request {i}"
        assert (logprobs is None) == (want_logprobs is None)
        for entry, want_entry in zip(logprobs or [], want_logprobs or []):
            assert entry.keys() == want_entry.keys()
            for t, (lp, rank) in entry.items():
                assert rank == want_entry[t][1] and lp == pytest.approx(want_entry[t][0], abs=1e-4)


def test_async_outputs_equal_sync_on_random_workloads(model):
    preemptions = 0
    for seed in range(8):
        workload = random_workload(seed)
        expected, _ = run(model, workload, async_scheduling=False)
        got, num_preemptions = run(model, workload, async_scheduling=True)
        assert_same(got, expected, set(workload["aborts"]))
        preemptions += num_preemptions
    assert preemptions > 0, "no workload preempted: the stale-output path went untested"


def test_n_samples_and_one_token_requests_equal_sync(model):
    """LLM.generate's own loop: n > 1 (child requests sharing the prompt's blocks), max_tokens=1, a stop string."""
    prompts = [[5, 6, 7, 8, 9, 10, 11], [40, 41], [7] * 13]
    params = [
        SamplingParams(temperature=0, max_tokens=6, n=3, ignore_eos=True),
        SamplingParams(temperature=0, max_tokens=1),
        SamplingParams(temperature=0, max_tokens=12, stop=["e"]),
    ]
    engines = [engine_llm(model[0], a, 12 * model[1]) for a in (False, True)]
    runs = [llm.generate(prompt_token_ids=prompts, sampling_params=params) for llm in engines]
    assert not engines[1].engine.has_unfinished_requests(), "a step was left in flight after the last request"
    sync, async_ = ([[(c.token_ids, c.text, c.finish_reason) for c in o.outputs] for o in r] for r in runs)
    assert async_ == sync and len(sync[0]) == 3


def test_async_scheduling_is_resolved_and_refused_where_unsupported(model):
    model_path = model[0]
    llm = engine_llm(model_path, None, 12)
    assert type(llm.engine.scheduler) is (AsyncScheduler if ASYNC_DEFAULT else Scheduler)
    assert (llm.engine.batch_queue is not None) is ASYNC_DEFAULT
    ngram = {"method": "ngram", "num_speculative_tokens": 2}
    assert type(engine_llm(model_path, None, 12, speculative_config=ngram).engine.scheduler) is Scheduler
    assert engine_llm(model_path, None, 12, scheduler_cls=Scheduler).engine.batch_queue is None
    for kwargs in ({"speculative_config": ngram}, {"scheduler_cls": Scheduler}):
        with pytest.raises(InvalidEngineArgumentError, match="async_scheduling=True cannot run with") as info:
            engine_llm(model_path, True, 12, **kwargs)
        assert info.value.parameter == "async_scheduling"
    with pytest.raises(InvalidEngineArgumentError, match="async_scheduling"):
        engine_llm(model_path, "yes", 12)
