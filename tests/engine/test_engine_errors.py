"""Bad input raises one documented exception with an actionable message, and loses nothing."""

import pytest

from nanoengine import LLM, SamplingParams
from nanoengine.errors import BackendUnavailableError, InvalidRequestError, KVCacheTooSmallError, ModelNotFoundError

pytestmark = pytest.mark.model

OK = SamplingParams(temperature=0, max_tokens=4)


@pytest.fixture(scope="module")
def small():
    # 8 usable blocks (128 tokens) and max_model_len 100, so both limits are easy to cross.
    return LLM(progress=False, num_gpu_blocks_override=9, max_model_len=100)


def assert_intact(llm):
    kv = llm.engine.kv_cache_manager
    assert not kv.coordinator.single_type_managers[0].req_to_blocks and not llm.engine.has_unfinished_requests()
    assert kv.block_pool.get_num_free_blocks() == llm.kv_cache.num_blocks - 1
    assert llm.generate("Hello", OK)[0].token_ids  # still serves
    assert not kv.coordinator.single_type_managers[0].req_to_blocks


@pytest.mark.parametrize(
    "call,match",
    [
        (lambda llm: llm.generate("", OK), "prompt is empty"),
        (lambda llm: llm.generate(prompt_token_ids=[], sampling_params=OK), "prompt is empty"),
        (lambda llm: llm.generate(["fine", ""], OK), "prompt is empty"),
        (lambda llm: llm.generate("word " * 120, OK), "max_model_len is 100"),
        (lambda llm: llm.generate(prompt_token_ids=[5] * 2000, sampling_params=OK), "max_model_len"),
        (lambda llm: llm.generate(prompt_token_ids=[5, 49152], sampling_params=OK), r"integers in \[0, 49152\)"),
        (lambda llm: llm.generate(prompt_token_ids=[5, -1], sampling_params=OK), r"integers in \[0, 49152\)"),
        (lambda llm: llm.generate(["hi", 3], OK), "must all be strings"),
        (lambda llm: llm.generate(prompt_token_ids=[[1, 2], 3], sampling_params=OK), "not a mix"),
        (lambda llm: llm.generate(["a", "b"], [OK]), "one per prompt"),
        (lambda llm: llm.generate("hi", prompt_token_ids=[1]), "exactly one of"),
        (lambda llm: llm.generate("a\ud800b", OK), "not valid Unicode text .* at character 1"),
        (lambda llm: llm.chat([{"role": "user", "content": "\udfff"}], OK), "not valid Unicode"),
        (lambda llm: llm.stream("hi", SamplingParams(n=2)), "stream\\(\\) yields one completion"),
    ],
)
def test_invalid_requests(small, call, match):
    with pytest.raises(InvalidRequestError, match=match):
        call(small)
    assert_intact(small)


def test_prompt_longer_than_the_kv_pool():
    llm = LLM(progress=False, num_gpu_blocks_override=4)  # 3 usable blocks = 48 tokens
    with pytest.raises(InvalidRequestError, match="whole KV pool holds 48.*raise kv_cache_memory_bytes"):
        llm.generate(prompt_token_ids=[7] * 60, sampling_params=OK)
    assert_intact(llm)


def test_output_that_outgrows_the_pool_is_capped_not_stuck():
    llm = LLM(progress=False, num_gpu_blocks_override=4)
    out = llm.generate(
        prompt_token_ids=[7] * 40, sampling_params=SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    )[0]
    assert out.finish_reason == "length" and len(out.token_ids) == 48 - 40 + 1
    assert_intact(llm)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"max_tokens": 0}, "max_tokens"),
        ({"temperature": -1}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"top_k": -5}, "top_k"),
    ],
)
def test_invalid_sampling_params(small, kwargs, match):
    with pytest.raises(InvalidRequestError, match=match):
        small.generate("hi", SamplingParams(**kwargs))
    assert_intact(small)


def test_unknown_model_name():
    with pytest.raises(ModelNotFoundError, match="No model file at 'llama-7b'"):
        LLM("llama-7b", progress=False)


def test_kv_budget_below_one_block():
    with pytest.raises(KVCacheTooSmallError, match=r"kv_cache_memory_bytes >= 1474560"):
        LLM(progress=False, kv_cache_memory_bytes=1000)
    with pytest.raises(KVCacheTooSmallError, match=r"num_gpu_blocks_override >= 2"):
        LLM(progress=False, num_gpu_blocks_override=1)


@pytest.mark.triton
def test_the_triton_backend_where_triton_is_missing_is_a_clear_error(monkeypatch):
    """As on macOS, where triton has no wheels: asking for the kernels says what to do instead."""
    import sys

    from nanoengine.attention import get_backend, triton_available
    from nanoengine.errors import BackendUnavailableError

    monkeypatch.setitem(sys.modules, "triton", None)
    assert not triton_available()
    with pytest.raises(BackendUnavailableError, match="attention_backend='torch'"):
        get_backend("triton")


@pytest.mark.parametrize(
    "triton_version, numpy_version, refused",
    [
        ("3.6.0", "2.4.0", True),
        ("3.6.0", "2.5.2", True),
        ("3.2.0", "2.4.6", True),
        ("3.6.0", "2.3.5", False),
        ("3.7.0", "2.5.2", False),
        ("3.9.0+git1234", "2.4.6", False),
    ],
)
def test_an_interpreter_that_numpy_breaks_is_refused_with_the_fix(triton_version, numpy_version, refused):
    """Triton's interpreter before 3.7 fails under NumPy 2.4+ deep inside every looping kernel; the
    backend refuses it up front and says what to install instead."""
    from nanoengine.attention.triton_backend import check_interpreter_numpy

    if not refused:
        check_interpreter_numpy(triton_version, numpy_version)
        return
    with pytest.raises(BackendUnavailableError, match=r"numpy<2\.4.*Triton of 3\.7"):
        check_interpreter_numpy(triton_version, numpy_version)
