"""Chapter 05's free-queue view: what it draws is the pool's real free queue and ref counts, step by step."""

import re
from pathlib import Path

import nbformat

from nanocourse.free_queue_view import (
    STORY,
    FreeQueueLab,
    FreeQueueView,
    free_list,
    remove_append_ns,
    time_remove_append,
)
from nanoengine.core import FreeKVCacheBlockQueue
from solutions.ch05_free_queue import FreeKVCacheBlockQueue as WorkedQueue

ROOT = Path(__file__).resolve().parents[2]
CHIP = re.compile(r"data-block='(\d+)' data-hashed='([01])' data-ref='(\d+)'")


def chips(fragment: str) -> list[tuple[int, bool, int]]:
    return [(int(b), h == "1", int(r)) for b, h, r in CHIP.findall(fragment)]


def assert_matches_pool(view: FreeQueueView) -> None:
    lab = view.lab
    queue = lab.pool.free_block_queue.get_all_free_blocks()
    assert chips(view.queue.value) == [(b.block_id, b.block_hash is not None, 0) for b in queue], "queue, head to tail"
    held = [b for name in lab.running for b in lab.manager.get_blocks(name).blocks[0]]
    assert chips(view.held.value) == [(b.block_id, b.block_hash is not None, b.ref_cnt) for b in held]
    assert all(b.ref_cnt > 0 for b in held) and {b.ref_cnt for b in queue} <= {0}
    assert len(queue) + len({b.block_id for b in held}) == lab.pool.num_gpu_blocks - 1, "every block is somewhere"
    stars = " ".join(f"{b.block_id}{'*' if b.block_hash is not None else ''}" for b in queue)
    assert f"hashed): {stars}" in view.text()


def test_each_story_step_draws_the_real_queue():
    view = FreeQueueView()
    assert_matches_pool(view)
    for _ in STORY:
        view.step_button.click()
        assert_matches_pool(view)
    events = view.lab.events
    assert view.num_steps == len(STORY) == len(events)
    view.step_button.click()
    assert len(view.lab.events) == len(STORY), "past the end of the story, Step does nothing"

    freed = events[2]
    assert (freed.to_head, freed.to_tail, freed.hashed) == ((), (1, 2, 3, 4), {1, 2, 3}), (
        "chapter 05's stand-in: every freed block to the tail, in its request's order"
    )
    assert freed.describe() == "free chat1: freed [1*, 2*, 3*, 4] to the tail"
    hit = events[4]
    assert hit.pulled == ((1, 7), (2, 8)) and hit.popped == (9, 10)
    assert all(0 < pos < 14 for _, pos in hit.pulled), "the hit removes blocks from the middle of the queue"
    assert events[5].evicted == (3, 5, 6, 7), "lazy eviction: cached blocks lose their hash only when popped"
    assert "pulled out of the queue at positions [7, 8]" in events[4].describe()


def test_freed_blocks_are_labelled_by_what_they_are_not_by_a_placement_rule():
    def reversed_to_head(queue, freed):
        queue.prepend_n(freed[::-1])

    lab = FreeQueueLab(place=reversed_to_head)
    lab.chat()
    freed = lab.free("chat1")
    assert (freed.to_head, freed.to_tail, freed.hashed) == ((4, 3, 2, 1), (), {1, 2, 3})
    assert freed.describe() == "free chat1: freed [4, 3*, 2*, 1*] to the head"
    assert lab.text().splitlines()[1].endswith(": 4 3* 2* 1* 5 6 7 8 9 10 11 12 13 14 15")


def test_buttons_act_on_the_pool_and_a_refusal_changes_nothing():
    view = FreeQueueView()
    view.chat_button.click()
    view.chat_button.click()  # the first chat still runs: its system-prompt blocks are shared, not pulled
    shared = view.lab.events[-1]
    assert shared.shared == (1, 2) and shared.pulled == ()
    assert [b.ref_cnt for b in view.lab.manager.get_blocks("chat2").blocks[0][:2]] == [2, 2]
    assert_matches_pool(view)
    while not view.lab.events[-1].refused:
        before = view.lab.text()
        view.allocate_button.click()
    assert view.lab.text().splitlines()[1:] == before.splitlines()[1:], "a refused request leaves the pool as it was"
    assert_matches_pool(view)
    while view.lab.running:
        view.free_button.click()
        assert_matches_pool(view)
    view.free_button.click()
    assert "no request is running" in view.log.value
    view.reset_button.click()
    assert view.num_steps == 0 and view.lab.events == [] and len(view.lab.free_order()) == 15


def test_the_worked_solution_queue_tells_the_same_story():
    engine = FreeQueueView()
    worked = FreeQueueView(lambda: FreeQueueLab(free_queue_cls=WorkedQueue))
    assert not isinstance(worked.lab.pool.free_block_queue, FreeKVCacheBlockQueue)
    for _ in STORY:
        engine.step()
        worked.step()
        assert worked.text() == engine.text()


def test_deque_baseline_does_the_same_work():
    linked, blocks = free_list(1000)
    ids, _ = free_list(1000, use_deque=True)
    picks = range(250, 750, 7)
    assert time_remove_append(linked, [blocks[i] for i in picks]) > 0
    assert time_remove_append(ids, list(picks)) > 0
    assert [b.block_id for b in linked.get_all_free_blocks()] == list(ids)
    assert list(ids)[-len(picks) :] == list(picks), "each moved block ends at the tail"
    assert remove_append_ns(1000, 50, repeats=1) > 0 and remove_append_ns(1000, 50, use_deque=True, repeats=1) > 0


def test_chapter_05_does_not_show_where_the_engine_puts_freed_blocks():
    """06.2 and 06.8 ask the learner to design the placement, so 05 (read first) shows only its stand-in."""
    notebook = nbformat.read(ROOT / "notebooks" / "05_free_queue.ipynb", as_version=4)
    texts = [cell.source for cell in notebook.cells if cell.cell_type == "markdown"]
    texts += [
        "".join(output.get("text", ""))
        for cell in notebook.cells
        if cell.cell_type == "code"
        for output in cell.outputs
    ]
    texts += [(ROOT / path).read_text() for path in ("nanocourse/hints/05.md", "exercises/ch05_free_queue.py")]
    sentence = r"(?:[^.]|\.(?=\w))*"  # within one sentence: no dot, unless inside a name (block_pool.py)
    for text in texts:
        assert not re.search(rf"(no hash|without a hash|unhashed){sentence}\bhead\b", text), text
        assert not re.search(r"\bhashed\)? (blocks? )?(go(es)? )?to the tail", text), text
        assert not re.search(rf"\bfree_blocks{sentence}\b(prepends|appends|puts|uses it)\b", text), text
        # A printed queue in which a freed chain sits last block first: the engine's reverse order.
        for left, right in re.findall(r"\b(\d+)\* (\d+)\*", text):
            assert int(left) < int(right), f"freed blocks shown in reverse order: {left}* {right}* in {text!r}"
