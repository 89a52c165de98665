"""The OpenAI-compatible server over HTTP, driven by the unmodified `openai` client against a real uvicorn server on
a free loopback port: the embedded SmolLM2, greedy unless a test says otherwise, short outputs."""

from __future__ import annotations

import time

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from nanoengine.entrypoints.llm import LLM
from nanoengine.entrypoints.openai.api_server import MAX_REQUEST_BODY_BYTES, BackgroundServer, serve_in_thread
from nanoengine.sampling_params import SamplingParams

pytestmark = pytest.mark.model
KEY = "test-key"
MODEL = "smol"
PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def server():
    # A pool of its own (the weights are shared with the session's `llm`, the reference).
    llm = LLM(progress=False, kv_cache_memory_bytes=128 * 2**20)
    with serve_in_thread(llm, served_model_name=MODEL, api_key=KEY) as s:
        yield s


@pytest.fixture
def client(server):
    with openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0, timeout=60) as c:
        yield c


def assert_idle(server: BackgroundServer, timeout: float = 5.0) -> None:
    """No request queued or running, and every block back in the free queue (the null block aside)."""
    engine = server.llm.engine
    pool = engine.kv_cache_manager.block_pool
    deadline = time.monotonic() + timeout
    while True:
        idle = (
            server.app.state.async_llm.num_unfinished_requests == 0
            and not engine.has_unfinished_requests()
            and pool.get_num_free_blocks() == pool.num_gpu_blocks - 1
        )
        if idle or time.monotonic() > deadline:
            break
        time.sleep(0.01)
    assert idle, f"{engine.scheduler.requests.keys()} unfinished, {pool.get_num_free_blocks()} blocks free"


def test_models_and_health(server, client):
    assert [m.id for m in client.models.list().data] == [MODEL]
    assert httpx.get(server.url + "/health").status_code == 200


def test_greedy_completion_equals_llm_generate(server, client, llm):
    reference = llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=8))[0]
    out = client.completions.create(
        model=MODEL, prompt=PROMPT, temperature=0, max_tokens=8, extra_body={"return_token_ids": True}
    )
    (choice,) = out.choices
    assert choice.model_extra["token_ids"] == reference.token_ids
    assert choice.text == reference.text and choice.finish_reason == reference.finish_reason
    assert out.usage.prompt_tokens == len(reference.prompt_token_ids)
    assert out.usage.completion_tokens == len(reference.token_ids)
    assert out.usage.total_tokens == out.usage.prompt_tokens + out.usage.completion_tokens
    # The same as a stream: the pieces add up to the text, and the last chunk holds the usage.
    chunks = list(
        client.completions.create(
            model=MODEL, prompt=PROMPT, temperature=0, max_tokens=8, stream=True, stream_options={"include_usage": True}
        )
    )
    assert "".join(c.choices[0].text for c in chunks if c.choices) == reference.text
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == len(reference.token_ids)
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert_idle(server)


def test_the_sampling_fields_clients_send_give_llm_generates_tokens(server, client, llm):
    """OpenAI's penalties and logit_bias, and vLLM's extra fields (repetition_penalty, min_p, min_tokens,
    stop_token_ids), reach SamplingParams as LLM.generate takes them."""
    fields = {"presence_penalty": 0.5, "frequency_penalty": 0.8, "logit_bias": {"28": 4.0}}
    extra = {
        "repetition_penalty": 1.3,
        "min_p": 0.05,
        "min_tokens": 3,
        "stop_token_ids": [30],
        "return_token_ids": True,
    }
    params = SamplingParams(
        temperature=0, max_tokens=10, **fields, **{k: v for k, v in extra.items() if k != "return_token_ids"}
    )
    reference = llm.generate(PROMPT, params)[0]
    out = client.completions.create(
        model=MODEL, prompt=PROMPT, temperature=0, max_tokens=10, **fields, extra_body=extra
    )
    assert out.choices[0].model_extra["token_ids"] == reference.token_ids
    plain = llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=10))[0]
    assert reference.token_ids != plain.token_ids, "the fields change the greedy tokens, so the test can fail"
    assert_idle(server)


def test_chat_streamed_and_not(server, client, llm):
    messages = [{"role": "user", "content": "What is the capital of Japan?"}]
    reference = llm.chat(messages, SamplingParams(temperature=0, max_tokens=10))
    out = client.chat.completions.create(model=MODEL, messages=messages, temperature=0, max_completion_tokens=10)
    assert out.choices[0].message.content == reference.text and out.choices[0].message.role == "assistant"
    assert out.usage.completion_tokens == len(reference.token_ids)
    chunks = list(
        client.chat.completions.create(
            model=MODEL, messages=messages, temperature=0, max_tokens=10, stream=True,
            stream_options={"include_usage": True},
        )
    )  # fmt: skip
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == reference.text
    assert chunks[-1].usage.prompt_tokens == out.usage.prompt_tokens
    assert_idle(server)


def test_n_seed_logprobs_and_stop(server, client):
    kwargs = {"model": MODEL, "prompt": PROMPT, "temperature": 1.0, "max_tokens": 6, "n": 3, "seed": 7, "logprobs": 2}
    first, again = client.completions.create(**kwargs), client.completions.create(**kwargs)
    assert [c.index for c in first.choices] == [0, 1, 2]
    assert [c.text for c in first.choices] == [c.text for c in again.choices]  # seeded: reproducible
    assert first.usage.completion_tokens == sum(len(c.logprobs.tokens) for c in first.choices)
    for choice in first.choices:
        assert "".join(choice.logprobs.tokens) == choice.text
        assert all(len(top) >= 2 for top in choice.logprobs.top_logprobs)
    chat = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=4, logprobs=True, top_logprobs=2
    )
    assert all(len(t.top_logprobs) == 2 for t in chat.choices[0].logprobs.content)
    prompt = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=1, extra_body={"prompt_logprobs": 1})
    entries = prompt.choices[0].model_extra["prompt_logprobs"]
    assert entries[0] is None and len(entries) == prompt.usage.prompt_tokens
    assert all(-9999.0 <= lp["logprob"] <= 0 for entry in entries[1:] for lp in entry.values())
    full = client.completions.create(model=MODEL, prompt=PROMPT, temperature=0, max_tokens=8).choices[0].text
    stop = " ".join(full.split()[1:3])  # two words of the greedy continuation, past its first: several tokens
    cut = client.completions.create(model=MODEL, prompt=PROMPT, temperature=0, max_tokens=8, stop=[stop]).choices[0]
    assert cut.text == full[: full.index(stop)] and cut.finish_reason == "stop"
    # Streamed, no piece of the stop string is ever sent (the stream holds back what could still become one).
    chunks = client.completions.create(
        model=MODEL, prompt=PROMPT, temperature=0, max_tokens=8, stop=[stop], stream=True
    )
    assert "".join(c.choices[0].text for c in chunks) == cut.text
    assert_idle(server)


BAD = [
    # (route, body, status, the field the error must name)
    ("completions", {"prompt": PROMPT, "temperature": "hot"}, 400, "temperature"),
    ("completions", {"prompt": PROMPT, "temperature": 5}, 400, "temperature"),
    ("completions", {"prompt": PROMPT, "top_p": 0}, 400, "top_p"),
    ("completions", {"prompt": PROMPT, "top_k": -5}, 400, "top_k"),
    ("completions", {"prompt": PROMPT, "n": 0}, 400, "n"),
    ("completions", {"prompt": PROMPT, "max_tokens": 0}, 400, "max_tokens"),
    ("completions", {"prompt": PROMPT, "logprobs": 1000}, 400, "logprobs"),
    ("completions", {"prompt": PROMPT, "seed": 2**70}, 400, "seed"),
    ("completions", {"prompt": PROMPT, "stop": [""]}, 400, "stop"),
    ("completions", {"prompt": PROMPT, "presence_penalty": 3}, 400, "presence_penalty"),
    ("completions", {"prompt": PROMPT, "repetition_penalty": 0}, 400, "repetition_penalty"),
    ("completions", {"prompt": PROMPT, "min_p": 1.5}, 400, "min_p"),
    ("completions", {"prompt": PROMPT, "stop_token_ids": [10**9]}, 400, "stop_token_ids"),
    ("completions", {"prompt": PROMPT, "min_tokens": 9, "max_tokens": 4}, 400, "min_tokens"),
    ("completions", {"prompt": PROMPT, "logit_bias": {"x": 1}}, 400, "logit_bias"),
    ("completions", {"prompt": PROMPT, "use_beam_search": True}, 400, "use_beam_search"),
    ("completions", {"prompt": PROMPT, "echo": True}, 400, "echo"),
    ("completions", {"prompt": PROMPT, "prompt_logprobs": 1, "stream": True}, 400, "prompt_logprobs"),
    ("completions", {"prompt": "word " * 3000}, 400, "prompt"),
    ("completions", {"prompt": []}, 400, "prompt"),
    ("completions", {"prompt": [[10**9]]}, 400, "prompt"),
    ("completions", {}, 400, "prompt"),
    ("completions", {"prompt": PROMPT, "model": "gpt-4"}, 404, "model"),
    ("chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "max_completion_tokens": 0}, 400,
     "max_completion_tokens"),
    ("chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "logprobs": True, "top_logprobs": 99}, 400,
     "top_logprobs"),
    ("chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "top_logprobs": 2}, 400, "top_logprobs"),
    ("chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "stream": True, "frequency_penalty": -9},
     400, "frequency_penalty"),
    ("chat/completions", {"messages": []}, 400, "messages"),
    ("chat/completions", {"messages": "Hi"}, 400, "messages"),
]  # fmt: skip


@pytest.mark.parametrize(("route", "body", "status", "param"), BAD, ids=[f"{r}-{p}" for r, _, _, p in BAD])
def test_bad_request_gets_openais_error_naming_the_field(server, client, route, body, status, param):
    response = httpx.post(f"{server.url}/v1/{route}", json=body, headers={"Authorization": f"Bearer {KEY}"})
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == status
    assert error["param"] == param, error
    assert client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=1).choices[0].text is not None
    assert_idle(server)


def test_malformed_json_unknown_fields_and_a_body_too_large(server, client):
    auth = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    response = httpx.post(f"{server.url}/v1/completions", content=b'{"prompt": "Hi",', headers=auth)
    assert response.status_code == 400 and response.json()["error"]["type"] == "BadRequestError"
    big = b'{"prompt": "' + b"a" * MAX_REQUEST_BODY_BYTES + b'"}'
    response = httpx.post(f"{server.url}/v1/completions", content=big, headers=auth)
    assert response.status_code == 413 and response.json()["error"]["code"] == 413
    # A field the API does not know is ignored, as vLLM ignores it.
    out = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=1, extra_body={"frobnicate": 1})
    assert out.choices[0].finish_reason == "length"


def test_a_client_that_disconnects_mid_stream_has_its_request_aborted(server):
    engine = server.llm.engine
    aborted = engine.stats.num_aborted_requests
    body = {"prompt": PROMPT, "max_tokens": 1000, "ignore_eos": True, "stream": True}
    with httpx.stream(
        "POST", f"{server.url}/v1/completions", json=body, headers={"Authorization": f"Bearer {KEY}"}
    ) as response:
        lines = response.iter_lines()
        assert next(line for line in lines if line.startswith("data: ")).startswith("data: {")
        assert engine.has_unfinished_requests()
    # Closed after one chunk: aborted (not run to 1000 tokens), nothing queued, every block free.
    assert_idle(server, timeout=2.0)
    assert engine.stats.num_aborted_requests == aborted + 1


def test_a_client_that_gives_up_on_a_whole_response_has_its_request_aborted(server):
    aborted = server.llm.engine.stats.num_aborted_requests
    body = {"prompt": PROMPT, "max_tokens": 1000, "ignore_eos": True}
    with pytest.raises(httpx.ReadTimeout):  # the client closes the connection when its timeout ends
        httpx.post(f"{server.url}/v1/completions", json=body, headers={"Authorization": f"Bearer {KEY}"}, timeout=1)
    assert_idle(server, timeout=2.0)
    assert server.llm.engine.stats.num_aborted_requests == aborted + 1


def test_metrics_parse_with_vllms_names(server, client):
    client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=3)
    text = httpx.get(server.url + "/metrics").text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    for name in (
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:prefix_cache_queries",
        "vllm:prefix_cache_hits",
        "vllm:time_to_first_token_seconds",
        "vllm:inter_token_latency_seconds",
        "vllm:request_time_per_output_token_seconds",
    ):
        assert name in families, name
    counts = [s for s in families["vllm:time_to_first_token_seconds"].samples if s.name.endswith("_count")]
    assert counts[0].value >= 1 and counts[0].labels == {"model_name": MODEL, "engine": "0"}
    queries = families["vllm:prefix_cache_queries"].samples[0].value
    assert queries >= len(server.llm.tokenizer.encode(PROMPT))


def test_api_key_is_required_on_v1_routes(server):
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        response = httpx.get(server.url + "/v1/models", headers=headers)
        assert response.status_code == 401 and response.json()["error"]["code"] == 401
    with (
        openai.OpenAI(base_url=server.url + "/v1", api_key="wrong", max_retries=0) as bad,
        pytest.raises(openai.AuthenticationError),
    ):
        bad.completions.create(model=MODEL, prompt=PROMPT, max_tokens=1)
    assert httpx.get(server.url + "/health").status_code == 200
