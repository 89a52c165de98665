"""Chapter 07 graded tasks: the scheduler. Run with `make grade CH=07`.

The NANOENGINE adapters set up a real Scheduler and KVCacheManager in the state each task
describes and read the answer off scheduler.schedule(): the engine's logic, not a second copy.
"""

import pytest

from nanoengine.core import KVCacheManager, get_request_block_hasher
from nanoengine.request import Request, RequestStatus
from nanoengine.scheduler import Scheduler, SchedulerConfig

CHAPTER = "ch07_scheduler"
BS = 16


def _scheduler(num_blocks, budget=1 << 20, max_num_seqs=64, threshold=0, policy="fcfs", caching=False):
    kv = KVCacheManager(BS, num_blocks, enable_caching=caching)
    return Scheduler(SchedulerConfig(budget, max_num_seqs, threshold, policy), kv)


def _make_running(s: Scheduler, request: Request, num_computed: int) -> None:
    """Put a request in the running list holding the blocks of its first num_computed tokens."""
    s.requests[request.request_id] = request
    s.kv_cache_manager.allocate_slots(request, num_computed)
    request.num_computed_tokens = num_computed
    request.status = RequestStatus.RUNNING
    s.running.append(request)


def _engine_chunk_plan(num_tokens, budget, threshold=0):
    s = _scheduler(num_tokens // BS + 2, budget, threshold=threshold)
    request = Request("lone", [7] * num_tokens)
    s.add_request(request)
    chunks = []
    while request.num_computed_tokens < num_tokens:
        chunks.append(s.schedule().num_scheduled_tokens["lone"])
    return chunks


def _engine_schedule_step(running_needs, waiting_needs, budget, max_num_seqs, threshold=0):
    s = _scheduler(sum(running_needs + waiting_needs) // BS + 2 * len(running_needs + waiting_needs) + 2,
                   budget, max_num_seqs, threshold)
    for i, need in enumerate(running_needs):  # each has one block computed, `need` tokens to go
        _make_running(s, Request(f"r{i}", [7] * (BS + need)), BS)
    for j, need in enumerate(waiting_needs):
        s.add_request(Request(f"w{j}", [7] * need))
    out = s.schedule().num_scheduled_tokens
    return ([out.get(f"r{i}", 0) for i in range(len(running_needs))],
            [out.get(f"w{j}", 0) for j in range(len(waiting_needs))])


def _engine_choose_victim(running, policy):
    s = _scheduler(2, policy=policy)
    s.running = [Request(rid, [7], priority=p, arrival_time=t) for rid, p, t in running]
    return s._choose_victim().request_id


def _engine_admits(num_prompt_tokens, block_size, num_free_blocks, num_hit_blocks, num_hit_blocks_free):
    """A pool in exactly that state, then the real scheduler tries to admit the prompt."""
    assert block_size == BS
    held = num_hit_blocks - num_hit_blocks_free
    # usable blocks: the holder's `held` hits, its own last block, and the free ones
    s = _scheduler(1 + held + 1 + num_free_blocks, caching=True)
    kv, hasher = s.kv_cache_manager, get_request_block_hasher(BS)
    tokens = list(range(num_prompt_tokens))
    # A donor caches the hit blocks; a running holder keeps using the first `held` of them.
    donor = Request("donor", tokens[: num_hit_blocks * BS], block_hasher=hasher)
    kv.allocate_slots(donor, donor.num_tokens)
    holder = Request("holder", tokens[: held * BS] + [99_999], block_hasher=hasher)
    hits, num_hit_tokens = kv.get_computed_blocks(holder)
    kv.allocate_slots(holder, 1, num_hit_tokens, hits)
    holder.num_computed_tokens, holder.status = holder.num_tokens, RequestStatus.RUNNING
    s.requests["holder"] = holder
    s.running.append(holder)
    kv.free(donor)
    assert kv.block_pool.get_num_free_blocks() == num_free_blocks
    s.add_request(Request("new", tokens, block_hasher=hasher))
    return "new" in s.schedule().num_scheduled_tokens


NANOENGINE = {
    "chunk_plan": _engine_chunk_plan,
    "schedule_step": _engine_schedule_step,
    "choose_victim": _engine_choose_victim,
    "admits": _engine_admits,
}


@pytest.mark.task("07.1", "chunk_plan splits a prompt by the budget and the threshold")
def test_chunk_plan(impl):
    assert impl.chunk_plan(150, 64) == [64, 64, 22]
    assert impl.chunk_plan(150, 64, 24) == [24] * 6 + [6], "the threshold caps every chunk"
    assert impl.chunk_plan(100, 32, 50) == [32, 32, 32, 4], "a threshold above the budget changes nothing"
    assert impl.chunk_plan(64, 64) == [64]
    assert impl.chunk_plan(5, 64, 16) == [5]


@pytest.mark.task("07.2", "schedule_step serves running requests first, from one budget")
def test_running_first(impl):
    assert impl.schedule_step([1, 1, 40], [30, 5], 64, 8) == ([1, 1, 40], [22, 0])
    assert impl.schedule_step([50, 30], [10], 64, 8) == ([50, 14], [0]), "a running request can be cut by the budget"
    assert impl.schedule_step([40, 40, 1], [3], 64, 8) == ([40, 24, 0], [0]), "once the budget is 0, nobody else runs"


@pytest.mark.task("07.2b", "schedule_step applies the threshold and max_num_seqs")
def test_threshold_and_max_seqs(impl):
    assert impl.schedule_step([1, 1, 40], [30, 5], 64, 8, threshold=16) == ([1, 1, 16], [16, 5])
    assert impl.schedule_step([1, 1, 1], [4, 4, 4], 64, 4) == ([1, 1, 1], [4, 0, 0]), "max_num_seqs counts running ones"
    assert impl.schedule_step([], [100, 100, 100], 256, 8, threshold=64) == ([], [64, 64, 64])


@pytest.mark.task("07.3", "choose_victim: the tail under FCFS, the worst (priority, arrival) otherwise")
def test_choose_victim(impl):
    running = [("a", 0, 1.0), ("b", 5, 2.0), ("c", 0, 3.0)]
    assert impl.choose_victim(running, "fcfs") == "c"
    assert impl.choose_victim(running, "priority") == "b"
    readmitted = [("old", 0, 1.0), ("x", 0, 5.0), ("y", 0, 3.0)]  # y was preempted and readmitted
    assert impl.choose_victim(readmitted, "fcfs") == "y", "FCFS takes the running list's tail, not the latest arrival"
    assert impl.choose_victim(readmitted, "priority") == "x", "equal priorities: the latest arrival goes"


@pytest.mark.task("07.4", "admits: the whole prompt must fit, and free cached hits cost a block")
def test_admission_gate(impl):
    assert impl.admits(100, 16, 7, 0, 0) is True
    assert impl.admits(100, 16, 6, 0, 0) is False
    assert impl.admits(200, 16, 5, 0, 0) is False, "a first chunk would fit, the whole prompt does not"
    assert impl.admits(100, 16, 4, 3, 0) is True, "hits held by running requests cost nothing"
    assert impl.admits(100, 16, 4, 3, 3) is False, "free cached hits leave the free queue too"
    assert impl.admits(100, 16, 7, 3, 3) is True
