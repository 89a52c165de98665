"""The scheduler on its own (no model): vLLM v1's budget, chunking, admission and preemption rules."""

from nanoengine.core import KVCacheManager, get_request_block_hasher
from nanoengine.core.sched.output import PLACEHOLDER_TOKEN_ID
from nanoengine.core.sched.scheduler import Scheduler, SchedulerConfig
from nanoengine.request import Request, RequestStatus
from nanoengine.sampling_params import SamplingParams
from nanoengine.worker.outputs import ModelRunnerOutput

BS = 4
HASHER = get_request_block_hasher(BS)


def make(num_blocks=64, **cfg) -> Scheduler:
    return Scheduler(SchedulerConfig(**cfg), KVCacheManager(BS, num_blocks))


def req(rid, n, priority=0, arrival=0.0, max_tokens=8, first=0):
    return Request(
        rid,
        list(range(first, first + n)),
        sampling_params=SamplingParams(max_tokens=max_tokens),
        eos_token_id=None,
        block_hasher=HASHER,
        priority=priority,
        arrival_time=arrival,
    )


def run_step(s: Scheduler, token=1):
    out = s.schedule()
    done = {
        r: [token]
        for r, n in out.num_scheduled_tokens.items()
        if s.requests[r].num_computed_tokens == s.requests[r].num_tokens
    }
    return out, s.update_from_output(out, ModelRunnerOutput(done))


def test_one_budget_mixes_prefill_chunks_and_decodes():
    s = make(max_num_batched_tokens=10, long_prefill_token_threshold=6)
    s.add_request(req("a", 3))
    out, _ = run_step(s)
    assert out.num_scheduled_tokens == {"a": 3}
    s.add_request(req("b", 20, first=100))
    out, _ = run_step(s)
    # Running first: a's decode (1 token), then b's first chunk, capped by the threshold.
    assert out.num_scheduled_tokens == {"a": 1, "b": 6}
    assert [d.req_id for d in out.scheduled_new_reqs] == ["b"] and out.scheduled_cached_reqs.req_ids == ["a"]
    out, _ = run_step(s)
    assert out.num_scheduled_tokens == {"a": 1, "b": 6} and out.total_num_scheduled_tokens <= 10


def test_budget_splits_a_long_prompt_without_threshold():
    s = make(max_num_batched_tokens=8)
    s.add_request(req("a", 20))
    chunks = [run_step(s)[0].num_scheduled_tokens["a"] for _ in range(4)]
    assert chunks == [8, 8, 4, 1]  # the 4th step is the first decode


def test_prefix_hit_at_admission_sets_computed_tokens():
    s = make()
    s.add_request(req("a", 10, max_tokens=1))
    run_step(s)  # a finishes after one token; its two full blocks stay cached
    s.add_request(b := req("b", 10, max_tokens=1))
    out, _ = run_step(s)
    new = out.scheduled_new_reqs[0]
    assert new.num_computed_tokens == 8 and out.num_scheduled_tokens["b"] == 2
    assert b.num_cached_tokens == 8


def test_fcfs_preempts_the_newest_and_admits_nobody_that_step():
    s = make(num_blocks=6)  # 5 usable blocks of 4 tokens
    s.add_request(req("old", 8, arrival=1.0, max_tokens=20))
    s.add_request(req("new", 8, arrival=2.0, max_tokens=20, first=50))
    run_step(s)
    s.add_request(req("late", 4, arrival=3.0, first=90))
    preempted = []
    for _ in range(6):
        out, _ = run_step(s)
        if out.preempted_req_ids:
            preempted = out.preempted_req_ids
            assert not out.scheduled_new_reqs, "no admission in a step that preempted"
            break
    assert preempted == {"new"}
    assert s.waiting[0].request_id == "new" and s.waiting[0].status == RequestStatus.PREEMPTED
    assert s.requests["new"].num_computed_tokens == 0


def test_priority_policy_preempts_the_lowest_priority():
    s = make(num_blocks=6, policy="priority")
    s.add_request(req("vip", 8, priority=0, arrival=2.0, max_tokens=20))
    s.add_request(req("bulk", 8, priority=5, arrival=1.0, max_tokens=20, first=50))
    run_step(s)
    for _ in range(6):
        out, _ = run_step(s)
        if out.preempted_req_ids:
            assert out.preempted_req_ids == {"bulk"}
            return
    raise AssertionError("expected a preemption")


def test_max_num_seqs_and_finished_requests_are_reported_and_freed():
    s = make(max_num_seqs=2)
    for i in range(3):
        s.add_request(req(f"r{i}", 4, max_tokens=1, first=10 * i))
    out, finished = run_step(s)
    assert set(out.num_scheduled_tokens) == {"r0", "r1"} and len(s.waiting) == 1
    assert {r.request_id for r in finished} == {"r0", "r1"}
    out, _ = run_step(s)
    assert out.finished_req_ids == {"r0", "r1"} and set(out.num_scheduled_tokens) == {"r2"}
    assert s.kv_cache_manager.get_block_ids("r0") == ([],)


def test_hit_stats_count_each_admission_once_not_each_lookup():
    s = make(num_blocks=4)  # 3 usable blocks
    s.add_request(req("big", 8, max_tokens=5))
    run_step(s)
    s.add_request(req("held", 8, first=40))  # needs 2 blocks while big holds 2 or 3: held at the gate
    for _ in range(3):
        run_step(s)
    assert s.kv_cache_manager.make_prefix_cache_stats().queries == 8, "only big's admission is counted"


def test_the_threshold_spares_a_lone_request_and_caps_once_another_waits():
    """vLLM 0.33: the threshold stops a long prompt starving others, so alone there is no cap."""
    s = make(max_num_batched_tokens=10, long_prefill_token_threshold=6)
    s.add_request(req("a", 20))
    assert run_step(s)[0].num_scheduled_tokens == {"a": 10}
    s.add_request(req("b", 20, first=100))
    assert run_step(s)[0].num_scheduled_tokens == {"a": 6, "b": 4}


def test_the_adaptive_threshold_never_caps_below_a_fair_share_of_the_budget():
    s = make(max_num_batched_tokens=16, long_prefill_token_threshold=4, long_prefill_token_threshold_adaptive=True)
    for name in "ab":
        s.add_request(req(name, 20, first=100 * (name == "b")))
    assert run_step(s)[0].num_scheduled_tokens == {"a": 8, "b": 8}  # max(4, 16 // 2)
    s = make(max_num_batched_tokens=16, long_prefill_token_threshold=4)
    for name in "ab":
        s.add_request(req(name, 20, first=100 * (name == "b")))
    assert run_step(s)[0].num_scheduled_tokens == {"a": 4, "b": 4}


def test_a_priority_request_that_preempts_itself_lets_the_running_loop_go_on():
    """vLLM 0.33 continues: the requests after the worst one rank higher and may fit in the blocks it freed."""
    s = make(num_blocks=7, policy="priority")
    s.add_request(req("a", 7, priority=1, arrival=0.0, max_tokens=64))
    run_step(s)
    s.add_request(req("b", 5, priority=0, arrival=1.0, max_tokens=64, first=100))
    outs = [run_step(s)[0] for _ in range(6)]
    assert outs[-2].num_scheduled_tokens == {"a": 1, "b": 1}
    assert outs[-1].num_scheduled_tokens == {"b": 1} and outs[-1].preempted_req_ids == {"a"}


def test_with_drafts_on_the_blocks_a_verify_step_accepts_are_cached_before_a_stop_frees_them():
    """vLLM 0.33's update_from_output caches a verify step's blocks (num_spec_tokens > 0): a request that stops
    in the step that accepted its drafts leaves them cached. Issue: block size 4, prompt [98], max_tokens 4."""
    s = make(num_spec_tokens=2, max_model_len=24)
    s.add_request(req("a", 1, first=98, max_tokens=4))
    run_step(s, token=7)  # the prompt: a's first output token is 7
    s.update_draft_token_ids({"a": [8, 9]})
    out = s.schedule()
    assert out.scheduled_spec_decode_tokens == {"a": [8, 9]}
    finished = s.update_from_output(out, ModelRunnerOutput({"a": [8, 9, 10]}))  # both accepted, then the bonus
    a = s.requests.get("a") or finished[0]
    assert a.output_token_ids == [7, 8, 9, 10] and a.status is RequestStatus.FINISHED_LENGTH_CAPPED
    pool = s.kv_cache_manager.block_pool
    assert pool.get_cached_block(a.block_hashes[0]) is not None, "block 0 ([98, 7, 8, 9]) was verified this step"


def test_drafts_proposed_after_a_prompt_chunk_are_dropped():
    """A request whose step was a prompt chunk (not its last) has no context to draft from yet: vLLM 0.33's
    update_draft_token_ids drops what it is given (is_prefill_chunk). Budget 4, a 5-token prompt: 4 + 1."""
    s = make(max_num_batched_tokens=4, num_spec_tokens=1)
    s.add_request(req("a", 5))
    out, _ = run_step(s)
    assert out.num_scheduled_tokens == {"a": 4} and s.requests["a"].is_prefill_chunk
    s.update_draft_token_ids({"a": [7]})
    assert s.requests["a"].spec_token_ids == []
    out, _ = run_step(s)
    assert out.num_scheduled_tokens == {"a": 1} and out.scheduled_spec_decode_tokens == {}
    assert not s.requests["a"].is_prefill_chunk
    s.update_draft_token_ids({"a": [7]})
    assert s.requests["a"].spec_token_ids == [7]


def test_a_draft_model_reserves_one_input_slot_per_scheduled_request():
    """vLLM 0.33's input_budget: each scheduled request also takes max_num_new_slots_for_drafting (1 for a draft
    model, whose first pass reads the sampled token too). Issue: draft model k=2, budget 16, one 16-token prompt."""
    s = make(max_num_batched_tokens=16, num_spec_tokens=2, num_lookahead_tokens=2, max_num_new_slots_for_drafting=1)
    s.add_request(req("a", 16))
    assert s.schedule().num_scheduled_tokens == {"a": 15}
    # Two requests: 7 + 1 slot, then 7 + 1 slot; nobody is planned once only the slots are left.
    s = make(max_num_batched_tokens=16, num_lookahead_tokens=2, num_spec_tokens=2, max_num_new_slots_for_drafting=1)
    for name in "abc":
        s.add_request(req(name, 7, first=100 * "abc".index(name)))
    assert s.schedule().num_scheduled_tokens == {"a": 7, "b": 7}


def test_a_new_one_token_request_beside_running_decodes_is_padded_to_1_plus_k():
    """vLLM 0.33 pads it with k placeholder drafts, so every request of the step feeds 1 + k tokens (a uniform
    decode batch), and rolls them back as rejected. Issue: n-gram k=2, one running, a one-token prompt arrives."""
    s = make(max_num_seqs=4, num_spec_tokens=2)
    s.add_request(req("a", 5))
    run_step(s, token=7)
    s.update_draft_token_ids({"a": [8, 9]})
    s.add_request(req("b", 1, first=100))
    out = s.schedule()
    assert out.num_scheduled_tokens == {"a": 3, "b": 3}
    assert out.scheduled_spec_decode_tokens == {"a": [8, 9], "b": [PLACEHOLDER_TOKEN_ID] * 2}
    s.update_from_output(out, ModelRunnerOutput({"a": [8, 5], "b": [6]}))  # b's placeholders: rejected
    assert s.requests["b"].num_computed_tokens == 1 and s.requests["b"].output_token_ids == [6]
    assert s.requests["a"].num_computed_tokens == 7


def test_padding_needs_running_decodes_room_and_a_threshold_that_holds_it():
    """No padding: alone (nothing running, nothing cached), beside a prompt chunk, or where the threshold is below
    1 + k, where vLLM 0.33 pads, cuts and fails its own assert (vllm-project/vllm#54028 skips the padding, as here).
    A padded request that does not fit the budget left waits: 1 + k tokens or none."""
    s = make(num_spec_tokens=2)
    s.add_request(req("a", 1))
    assert s.schedule().num_scheduled_tokens == {"a": 1}

    s = make(max_num_batched_tokens=8, long_prefill_token_threshold=5, num_spec_tokens=2, max_num_seqs=4)
    s.add_request(req("a", 20))
    run_step(s)  # a is mid-prompt
    s.add_request(req("b", 1, first=100))
    assert s.schedule().num_scheduled_tokens == {"a": 5, "b": 1}  # 3 were left for a padded b

    for threshold, expected in ((2, {"a": 2, "b": 1}), (3, {"a": 3, "b": 3})):
        s = make(num_spec_tokens=2, long_prefill_token_threshold=threshold, max_num_seqs=4)
        s.add_request(req("a", 1))
        run_step(s, token=7)
        s.update_draft_token_ids({"a": [8, 9]})
        s.add_request(req("b", 1, first=100))
        assert s.schedule().num_scheduled_tokens == expected, threshold

    s = make(max_num_batched_tokens=5, num_spec_tokens=2, max_num_seqs=4)
    s.add_request(req("a", 1))
    run_step(s, token=7)
    s.update_draft_token_ids({"a": [8, 9]})
    s.add_request(req("b", 1, first=100))
    assert s.schedule().num_scheduled_tokens == {"a": 3}  # b would need 3 of the 2 left


def test_a_lone_request_outgrowing_a_pool_below_max_model_len_is_capped():
    """Where the pool holds fewer tokens than max_model_len (vLLM 0.33 refuses to start so), a request alone that
    outgrows it ends FINISHED_LENGTH_CAPPED rather than preempting itself for ever. Issue's case: 2 usable blocks
    of 4 tokens, a 1-token prompt with max_tokens 9."""
    s = make(num_blocks=3, max_num_batched_tokens=1)
    s.add_request(req("a", 1, max_tokens=9))
    finished = []
    for _ in range(12):
        finished += run_step(s)[1]
    assert [(r.request_id, r.status) for r in finished] == [("a", RequestStatus.FINISHED_LENGTH_CAPPED)]
    assert len(finished[0].output_token_ids) == 8 and s.num_preemptions == 0


def test_requests_skipped_for_stale_output_go_back_in_front_in_their_order_and_do_not_block_the_rest():
    """vLLM 0.33's waiting loop skips a request whose output from before its preemption is still in flight
    (skip_request: popped, the loop goes on) and, after the loop, prepends the skipped ones in their order
    (prepend_requests): ahead of every request the loop did not reach, so the queue's order is unchanged and
    the requests behind a skipped one are admitted meanwhile. A refusal for blocks stops the loop (break)."""
    s = make(num_blocks=8)  # 7 usable blocks of 4 tokens: "e" (10 blocks) never fits
    for i, name in enumerate("abcd"):
        s.add_request(req(name, 4, first=10 * i))
    s.add_request(req("e", 40, first=100))
    for name in "ac":  # as preempt() leaves a request whose last step is still in flight
        s.requests[name].num_stale_output_tokens = 1
    out = s.schedule()
    assert [r.req_id for r in out.scheduled_new_reqs] == ["b", "d"]
    assert [r.request_id for r in s.waiting] == ["a", "c", "e"]
    for name in "ac":  # the in-flight output is delivered: both are admitted, oldest first
        s.requests[name].num_stale_output_tokens = 0
    assert [r.req_id for r in s.schedule().scheduled_new_reqs] == ["a", "c"]
