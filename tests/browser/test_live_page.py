"""The server's /live page in headless Chromium while `openai` clients stream from threads: the page follows the
engine (requests arrive and finish, blocks are taken and freed, the prefix cache starts to hit), drawn with the
course's pictures as `python -m nanocourse serve` passes them. No JupyterLab: only the browser fixture."""

from __future__ import annotations

import os
import threading

import openai
import pytest

from nanocourse.engine_view import engine_state_html
from nanoengine.entrypoints.llm import LLM
from nanoengine.entrypoints.openai.api_server import serve_in_thread

pytestmark = pytest.mark.model
KEY, MODEL = "live-key", "smol"
SYSTEM = "You are a helpful assistant who answers questions about the geography of Europe briefly and exactly. " * 3
SUMMARY = "e => Object.assign({}, e.dataset)"  # #engine-summary's data- attributes: running, used-blocks, hit-rate


@pytest.fixture(scope="module")
def server():
    llm = LLM(progress=False, kv_cache_memory_bytes=64 * 2**20)
    with serve_in_thread(llm, served_model_name=MODEL, api_key=KEY, live_view=engine_state_html) as s:
        yield s


def stream_from_threads(url: str, questions: list[str]) -> tuple[list[threading.Thread], list[str]]:
    """One streaming client per question, each in a thread; their texts land in the list returned."""
    client = openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0, timeout=120)
    texts: list[str] = []

    def stream(question: str) -> None:
        chunks = client.completions.create(
            model=MODEL,
            prompt=SYSTEM + question,
            max_tokens=8,
            temperature=0,
            stream=True,
            extra_body={"ignore_eos": True},  # 8 tokens each, however soon the model would stop
        )
        texts.append("".join(c.choices[0].text for c in chunks if c.choices))

    threads = [threading.Thread(target=stream, args=(q,)) for q in questions]
    for t in threads:
        t.start()
    return threads, texts


def watch(page, threads: list[threading.Thread]) -> list[dict[str, str]]:
    """The page's summary every 50 ms until the threads are done, then until it shows the engine idle again."""
    seen = []
    while any(t.is_alive() for t in threads):
        seen.append(page.eval_on_selector("#engine-summary", SUMMARY))
        page.wait_for_timeout(50)
    page.wait_for_function(
        "() => { const d = document.querySelector('#engine-summary').dataset;"
        " return d.running === '0' && d.waiting === '0' && d.usedBlocks === '0'; }",
        timeout=15_000,
    )
    return seen + [page.eval_on_selector("#engine-summary", SUMMARY)]


def test_live_page_follows_requests_as_they_arrive_and_finish(browser, server, shots):
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.goto(server.url + "/live")  # no API key: the page is not under /v1
    page.wait_for_selector("#engine-summary")
    idle = page.eval_on_selector("#engine-summary", SUMMARY)
    assert (idle["running"], idle["usedBlocks"], idle["hitRate"]) == ("0", "0", "")
    assert page.locator("td[data-kind='null']").count() == 1  # the course's pool map, every block drawn
    assert page.locator("td[data-block]").count() == int(idle["numBlocks"]) + 1

    # One client first: its prompt fills blocks, and nothing is in the cache to hit.
    threads, texts = stream_from_threads(server.url, ["Q: What is the capital of France? A:"])
    first = watch(page, threads)
    assert texts and texts[0]
    assert max(int(s["running"]) for s in first) == 1 and max(int(s["usedBlocks"]) for s in first) > 0
    assert first[-1]["hitRate"] == "0.0000" and int(first[-1]["cachedBlocks"]) > 0  # freed, still cached

    # Three more with the same system prompt: they run together, share its cached blocks, and the hit rate rises.
    questions = [f"Q: What is the capital of {c}? A:" for c in ("Spain", "Italy", "Norway")]
    threads, texts = stream_from_threads(server.url, questions)
    shared_seen = False
    while any(t.is_alive() for t in threads) and not shared_seen:
        shared_seen = page.locator("td[data-kind='shared']").count() > 0  # a block several requests hold
        page.wait_for_timeout(50)
    if shared_seen:
        page.screenshot(path=os.path.join(shots, "live_page.png"), full_page=True)
    second = watch(page, threads)
    assert len(texts) == len(questions) and all(texts)
    assert shared_seen, "no shared block was ever drawn while three requests with one prefix ran"
    assert max(int(s["running"]) for s in second) > 1
    assert float(second[-1]["hitRate"]) > 0.3
    assert page.locator("td[data-kind='used'], td[data-kind='shared']").count() == 0
    steps = page.locator(".live-steps > div").all_inner_texts()
    assert steps and all(line.startswith("step ") for line in steps) and any("done r" in line for line in steps)
    assert not errors, errors
    context.close()
