"""The course's pictures of a serving engine's snapshot (nanocourse/engine_view.py), which `python -m nanocourse serve`
hands the server's /live page: the same pool map and free-queue chips the chapters draw from a live pool."""

from __future__ import annotations

import re

from nanocourse.engine_view import GRID_COLUMNS, engine_state_html
from nanocourse.pool_map import block_states, snapshot_block_states
from nanoengine.config import LlamaConfig
from nanoengine.engine.engine_state import EngineStateRecorder
from nanoengine.entrypoints.llm import LLM
from nanoengine.entrypoints.openai.live import FREE_QUEUE_HEAD, FREE_QUEUE_TAIL
from nanoengine.model import LlamaForCausalLM
from nanoengine.sampling_params import SamplingParams

PREFIX = list(range(100, 116))


def test_snapshot_draws_what_the_live_pool_draws():
    llm = LLM(LlamaForCausalLM.random(LlamaConfig.tiny(), seed=0), block_size=4, num_gpu_blocks_override=64)
    engine = llm.engine
    recorder = EngineStateRecorder(engine)
    params = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    done = engine.add_request(PREFIX + [1], SamplingParams(temperature=0, max_tokens=1))
    engine.step()  # finished: its blocks are free and cached
    running = [engine.add_request(PREFIX + [i, i + 1, i + 2, i + 3, i + 4], params) for i in (5, 20)]
    engine.step()
    state = recorder.take()
    assert snapshot_block_states(state) == block_states(engine.kv_cache_manager)  # shared, used, cached, free, null
    page = engine_state_html(state)
    cells = re.findall(r"<td title='[^']*' data-block='(\d+)' data-kind='(\w+)'", page)
    assert [(int(i), k) for i, k in cells] == [(s.block_id, s.kind) for s in snapshot_block_states(state)]
    assert {k for _, k in cells} >= {"null", "shared", "used", "free"}
    assert page.count("<tr>") == -(-len(state.ref_cnt) // GRID_COLUMNS)
    chips = [int(i) for i in re.findall(r"<span title='[^']*' data-block='(\d+)'", page)]
    assert len(state.free_queue) > FREE_QUEUE_HEAD + FREE_QUEUE_TAIL
    assert chips == state.free_queue[:FREE_QUEUE_HEAD] + state.free_queue[-FREE_QUEUE_TAIL:]
    hashed = dict(re.findall(r"<span title='[^']*' data-block='(\d+)' data-hashed='(\d)'", page))
    assert all(hashed[str(i)] == str(int(state.block_hashes[i] is not None)) for i in chips)
    assert f"{len(state.free_queue) - len(chips)} more" in page
    assert all(f">r{r}<" in page for r in running) and "+r1(cache 16) +r2(cache 16)" in page
    assert f"done r{done}" in page and page.count("step ") == 2


def test_nanocourse_serve_hands_the_server_the_course_pictures(monkeypatch):
    import nanocourse.__main__ as cli

    seen = {}

    def serve_cli(build_llm, args, live_view=None):
        seen.update(port=args.port, live_view=live_view)
        return 0

    monkeypatch.setattr(cli, "serve_cli", serve_cli)
    assert cli.main(["serve", "--port", "8123"]) == 0
    assert seen == {"port": 8123, "live_view": engine_state_html}
