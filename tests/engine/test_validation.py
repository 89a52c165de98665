"""Any value of any argument of SamplingParams, LLM(...) and generate() either works or raises the one
documented exception naming that argument; never a bare builtin error from deep inside, and never a
request left behind (hypothesis draws sensible values and odd ones of every type)."""

import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from nanoengine import LLM, SamplingParams
from nanoengine.config import LlamaConfig
from nanoengine.errors import InvalidEngineArgumentError, InvalidRequestError, KVCacheTooSmallError
from nanoengine.model import LlamaForCausalLM

MODEL = LlamaForCausalLM.random(LlamaConfig.tiny(), seed=0)

ODD = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**20), 10**20),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=4),
    st.lists(st.integers(-3, 300), max_size=3),
    st.dictionaries(st.text(max_size=2), st.integers(), max_size=2),
    st.sampled_from([object(), np.int64(3), np.float32(0.5), torch.tensor(2), -1, 0, 1, 2, 3]),
)

SAMPLING = {
    "temperature": st.one_of(st.floats(0, 2), ODD),
    "top_p": st.one_of(st.floats(0, 1), ODD),
    "top_k": st.one_of(st.integers(-2, 300), ODD),
    "max_tokens": st.one_of(st.integers(-1, 10**12), ODD),
    "seed": st.one_of(st.integers(-2, 2**64), ODD),
    "stop": st.one_of(st.text(max_size=3), st.lists(st.text(max_size=3), max_size=3), ODD),
    "ignore_eos": st.one_of(st.booleans(), ODD),
    "n": st.one_of(st.integers(-1, 3), st.sampled_from([16384, 16385, 10**9]), ODD),
    "logprobs": st.one_of(st.integers(-2, 300), ODD),
    "prompt_logprobs": st.one_of(st.integers(-2, 300), ODD),
    "min_p": st.one_of(st.floats(-0.5, 1.5), ODD),
    "presence_penalty": st.one_of(st.floats(-3, 3), ODD),
    "frequency_penalty": st.one_of(st.floats(-3, 3), ODD),
    "repetition_penalty": st.one_of(st.floats(-1, 3), ODD),
    "min_tokens": st.one_of(st.integers(-1, 20), ODD),
    "stop_token_ids": st.one_of(st.lists(st.integers(-2, 300), max_size=3), ODD),
    "logit_bias": st.one_of(st.dictionaries(st.integers(-2, 300), st.floats(-200, 200), max_size=3), ODD),
}

ENGINE = {
    "block_size": st.one_of(st.integers(-2, 40), ODD),
    "max_num_seqs": st.one_of(st.integers(-1, 8), ODD),
    "max_num_batched_tokens": st.one_of(st.integers(-1, 64), ODD),
    "long_prefill_token_threshold": st.one_of(st.integers(-1, 20), ODD),
    "kv_cache_memory_bytes": st.one_of(st.sampled_from([2**16, 2**20, 1000, 0, 10**30]), ODD),
    "num_gpu_blocks_override": st.one_of(st.integers(-1, 64), st.just(10**30), ODD),
    "gpu_memory_utilization": st.one_of(st.floats(0, 1), ODD),
    "max_model_len": st.one_of(st.integers(-1, 600), ODD),
    "max_logprobs": st.one_of(st.integers(-2, 30), ODD),
    "scheduling_policy": st.one_of(st.sampled_from(["fcfs", "priority", "sjf"]), ODD),
    "hash_algo": st.one_of(st.sampled_from(["xxhash", "sha256", "md5"]), ODD),
    "attention_backend": st.one_of(st.sampled_from(["torch", "cuda"]), ODD),
    "enable_prefix_caching": st.one_of(st.booleans(), ODD),
    "enforce_eager": st.one_of(st.booleans(), ODD),
    **{
        seam: st.one_of(st.sampled_from([int, dict, list, object, str, lambda *a: None]), ODD)
        for seam in (
            "scheduler_cls",
            "block_table_cls",
            "kv_cache_manager_cls",
            "free_queue_cls",
            "block_pool",
            "sliding_window_manager_cls",
            "hash_block_tokens",
        )
    },
}

CALL = {
    "cache_salt": st.one_of(st.text(max_size=3), ODD),
    "priority": st.one_of(st.integers(-5, 5), ODD),
    "use_tqdm": st.one_of(st.booleans(), ODD),
}


def some_of(strategies: dict):
    return st.fixed_dictionaries({}, optional=strategies)


def assert_names_the_argument(error, given: dict):
    assert error.parameter in given, f"{error!r} names {error.parameter!r}, not one of the arguments given"
    assert error.parameter in str(error)


def assert_clean(llm: LLM) -> None:
    engine = llm.engine
    assert not engine.has_unfinished_requests() and not engine.scheduler.requests and not engine.outputs
    assert engine.kv_cache_manager.block_pool.get_num_free_blocks() == llm.kv_cache.num_blocks - 1


@pytest.fixture(scope="module")
def llm():
    return LLM(MODEL, block_size=4, kv_cache_memory_bytes=2**20, max_model_len=12, progress=False)


def make_params(kwargs):
    try:
        return SamplingParams(**kwargs)
    except InvalidRequestError as error:
        assert_names_the_argument(error, kwargs)
        return None


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sampling=some_of(SAMPLING), call=some_of(CALL))
# A penalty near 0 sent seen tokens' logits to +inf and the draw's softmax to NaN (found by this test).
@example(sampling={"repetition_penalty": 5.249500483409637e-98}, call={})
@example(sampling={"temperature": 1e-30}, call={})
def test_any_request_arguments_work_or_raise_the_documented_error(llm, sampling, call):
    params = make_params(sampling)
    if params is None:
        return
    assert math.isfinite(params.temperature) and params.n >= 1 and all(isinstance(s, str) for s in params.stop)
    if params.n > 3:  # valid, but thousands of samples are no test of validation
        return
    try:
        out = llm.generate(prompt_token_ids=[1, 2, 3], sampling_params=params, **call)
        assert len(out[0].outputs) == params.n
    except InvalidRequestError as error:
        assert_names_the_argument(error, {**sampling, **call})
    assert_clean(llm)


@settings(max_examples=150, deadline=None)
@given(engine=some_of(ENGINE))
def test_any_engine_arguments_work_or_raise_the_documented_error(engine):
    try:
        llm = LLM(MODEL, progress=False, **{"kv_cache_memory_bytes": 2**20, **engine})
    except InvalidEngineArgumentError as error:
        assert_names_the_argument(error, {"kv_cache_memory_bytes": 2**20, **engine})
        return
    except KVCacheTooSmallError as error:  # a pool below two blocks: it says which argument to raise
        assert "num_gpu_blocks_override" in str(error) and "kv_cache_memory_bytes" in str(error)
        return
    try:
        out = llm.generate(prompt_token_ids=[1, 2, 3], sampling_params=SamplingParams(temperature=0, max_tokens=2))
        assert out[0].outputs[0].token_ids
    except InvalidRequestError as error:  # the prompt itself does not fit what these arguments allow
        assert "max_model_len" in str(error) or "KV pool" in str(error)
    assert_clean(llm)


@pytest.mark.parametrize(
    "kwargs,parameter",
    [
        ({"block_size": 0}, "block_size"),
        ({"block_size": -16}, "block_size"),
        ({"max_model_len": 0}, "max_model_len"),
        ({"max_model_len": 10**6}, "max_model_len"),
        ({"num_gpu_blocks_override": 10**30}, "num_gpu_blocks_override"),
        ({"kv_cache_memory_bytes": 10**30}, "kv_cache_memory_bytes"),
        ({"scheduler_cls": object()}, "scheduler_cls"),
        ({"scheduler_cls": int}, "scheduler_cls"),
        ({"scheduler_cls": lambda config, manager: object()}, "scheduler_cls"),
        ({"block_pool": lambda num_blocks, enable_caching: object()}, "block_pool"),
        ({"free_queue_cls": list}, "free_queue_cls"),
        ({"block_table_cls": dict}, "block_table_cls"),
        ({"sliding_window_manager_cls": int}, "sliding_window_manager_cls"),
        ({"hash_block_tokens": "xxhash"}, "hash_block_tokens"),
        ({"hash_block_tokens": str}, "hash_block_tokens"),
        ({"hash_block_tokens": lambda *a: None}, "hash_block_tokens"),
        ({"hash_block_tokens": lambda *a: [1]}, "hash_block_tokens"),
        ({"device": "tpu"}, "device"),
        ({"device": "mps"}, "device"),  # this machine has no MPS (nor CUDA): refused at construction
        ({"device": "meta"}, "device"),
        ({"device": "cuda:7"}, "device"),
        ({"dtype": torch.int8}, "dtype"),
        ({"gpu_memory_utilization": float("nan")}, "gpu_memory_utilization"),
    ],
)
def test_the_issues_engine_arguments(kwargs, parameter):
    with pytest.raises(InvalidEngineArgumentError, match=parameter) as info:
        LLM(MODEL, progress=False, **kwargs)
    assert info.value.parameter == parameter


def test_a_field_changed_after_construction_is_caught_at_the_door(llm):
    params = SamplingParams(temperature=0, max_tokens=2)
    params.temperature = float("nan")
    with pytest.raises(InvalidRequestError, match="temperature"):
        llm.generate(prompt_token_ids=[1, 2, 3], sampling_params=params)
    assert_clean(llm)
