"""Chapter 13 graded tasks: speculative decoding: draft, verify, accept, roll back. Run with `make grade CH=13`."""

import math
import random
from collections import Counter

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from nanocourse import spec_design
from nanocourse.builds_on import scheduler_note
from nanocourse.differential import replay_workload, scheduler_config, scheduler_workloads
from nanocourse.grading import note
from nanocourse.spec_design import BAR_FACTOR, COST_PER_DRAFT, K_MAX, TRACES, bar, best_fixed, fixed, measure
from nanoengine import LLM, SamplingParams
from nanoengine.config import LlamaConfig
from nanoengine.core import KVCacheManager, get_request_block_hasher, make_block_hash_with_group_id
from nanoengine.core.sched.scheduler import Scheduler, SchedulerConfig
from nanoengine.model import LlamaForCausalLM
from nanoengine.request import Request, RequestStatus
from nanoengine.sample.rejection_sampler import rejection_sample as engine_rejection_sample
from nanoengine.sample.sampler import target_probs
from nanoengine.spec_decode.ngram_proposer import NgramProposer as EngineNgramProposer
from nanoengine.worker.outputs import ModelRunnerOutput

CHAPTER = "ch13_spec_decode"


class _EstimatedAcceptRate:
    """Task 13.7 in "nanoengine" mode, where the engine keeps vLLM's fixed k: a design that passes, other than the
    worked solution's. It keeps a running estimate a of the chance that a draft is accepted (each draft a step
    judged counts, weighted 0.2 against the past) and proposes the k that maximises the expected tokens per cost,
    (1 - a^(k+1)) / (1 - a) / (1 + COST_PER_DRAFT k); at k = 0 it probes with one draft every third step."""

    def __init__(self):
        self.rate = 0.5

    def num_drafts(self, history):
        if history:
            proposed, accepted = history[-1]
            for i in range(min(proposed, accepted + 1)):  # the drafts judged: the accepted ones and the first rejected
                self.rate = 0.8 * self.rate + 0.2 * (i < accepted)
        a = min(self.rate, 0.999)
        k = max(range(K_MAX + 1), key=lambda k: (1 - a ** (k + 1)) / (1 - a) / (1 + COST_PER_DRAFT * k))
        return k or int(len(history) % 3 == 0)


NANOENGINE = {
    "NgramProposer": EngineNgramProposer,
    "rejection_sample": engine_rejection_sample,
    "Scheduler": Scheduler,
    "DraftLengthDesign": _EstimatedAcceptRate,
}
BS = 4


@pytest.fixture(scope="module", autouse=True)
def says_what_the_scheduler_extends(impl):
    """The scorecard's line under chapter 13's heading: the Scheduler that 13.4 to 13.6 grade is chapter 07's
    (yours once chapter 07 passes its grade, nanoengine's until then) with your two speculative methods."""
    note("13", scheduler_note(impl.Scheduler))


# ---- 13.3: sampled rows ---------------------------------------------------------------------------------------
SAMPLED = [
    SamplingParams(temperature=1.0),
    SamplingParams(temperature=0.7, top_k=3),
    SamplingParams(temperature=1.3, top_p=0.7),
]


def describe(p: SamplingParams) -> str:
    return f"temperature {p.temperature}, top_k {p.top_k}, top_p {p.top_p}"


@pytest.mark.task("13.3", "rejection_random_sample: tokens distributed exactly as sampling from the target")
def test_sampled_rows(impl):
    """The rules every output obeys, the request's own generator, then the distribution of the tokens emitted."""
    check_sampled_rules(impl)
    check_own_generators(impl)
    check_sampled_distribution(impl)
    check_drafts_accepted_independently(impl)


def check_own_generators(impl):
    """The same per-request seeds give the same tokens, whatever torch's global generator does meanwhile."""
    logits = torch.randn(8, 6, generator=torch.Generator().manual_seed(3))
    drafts, params = [[1, 2, 3], [4, 5], []], [SamplingParams(temperature=1.0)] * 3
    runs = []
    for global_seed in (0, 1):
        torch.manual_seed(global_seed)
        runs.append(
            [
                impl.rejection_sample(
                    logits.clone(),
                    [list(d) for d in drafts],
                    params,
                    [torch.Generator().manual_seed(seed + r) for r in range(3)],
                )
                for seed in range(20)
            ]
        )
    if runs[0] != runs[1]:
        first, then = next((a, b) for a, b in zip(*runs) if a != b)
        raise AssertionError(
            "three sampled requests (drafts [1, 2, 3], [4, 5], none) verified 20 times with generators seeded 0..22, "
            "once after torch.manual_seed(0) and once after torch.manual_seed(1), gave different tokens: every random "
            "number of request r must come from generators[r] (torch.rand((), generator=gen), draw(probs, gen)), so "
            f"that a seeded request is reproducible; the same seeds gave {first}, then {then}"
        )


def check_drafts_accepted_independently(impl):
    """Two drafts of probability 1/2 each are both accepted a quarter of the time: a fresh u for every draft."""
    n, params = 4000, SamplingParams(temperature=1.0)
    gen = torch.Generator().manual_seed(11)
    runs = impl.rejection_sample(torch.zeros(3 * n, 2), [[0, 0] for _ in range(n)], [params] * n, [gen] * n)
    both = sum(len(run) == 3 for run in runs) / n
    assert abs(both - 0.25) < 5 * math.sqrt(0.25 * 0.75 / n) + 0.005, (
        f"{n} verify steps of one request, drafts [0, 0], every row's p = [0.5, 0.5]: the first draft is accepted "
        f"with probability 0.5 and then the second, independently, with 0.5, so both a quarter of the time; yours "
        f"{both:.3f}: the two verdicts are not independent"
    )


def check_sampled_rules(impl):
    rng = random.Random(31)
    gen = torch.Generator().manual_seed(31)
    for case in range(300):
        vocab = rng.choice([4, 8])
        params = rng.choice(SAMPLED)
        lengths = [rng.randrange(0, 4) for _ in range(rng.randrange(1, 4))]
        logits = torch.randn(sum(lengths) + len(lengths), vocab, generator=gen) * 2
        drafts = [[rng.randrange(vocab) for _ in range(n)] for n in lengths]
        got = impl.rejection_sample(
            logits.clone(),
            [list(d) for d in drafts],
            [params] * len(drafts),
            [torch.Generator().manual_seed(case)] * len(drafts),
        )
        where = f"case {case}: {describe(params)}, drafts {drafts}"
        assert isinstance(got, list) and len(got) == len(drafts), f"{where}: one list of tokens per request, got {got}"
        row = 0
        for r, (d, out) in enumerate(zip(drafts, got)):
            assert 1 <= len(out) <= len(d) + 1, f"{where}: request {r} emits 1 to {len(d) + 1} tokens, yours {out}"
            accepted = len(out) - 1
            assert out[:accepted] == d[:accepted], (
                f"{where}: request {r}'s output is an accepted prefix of its drafts then one token; yours {out}"
            )
            for i, token in enumerate(out):
                p = target_probs(logits[row + i], params)
                assert float(p[token]) > 0, (
                    f"{where}: request {r} emits {token} at position {i}, which has probability 0 under row "
                    f"{row + i}'s tempered, top-k/top-p filtered distribution (a draft of probability 0 is never "
                    f"accepted, and the token drawn after is drawn from that distribution); yours {out}"
                )
            if accepted < len(d):
                assert out[-1] != d[accepted], (
                    f"{where}: request {r} rejected draft {d[accepted]} at position {accepted} yet emitted it there. "
                    f"Then that token comes out at that position both when its draft is accepted and after a "
                    f"rejection, more often than its probability under the row's p allows; yours {out}"
                )
            row += len(d) + 1
    # A draft of probability 1 (top_k = 1 keeps only the argmax) is always accepted.
    logits = torch.randn(4, 8, generator=gen)
    best = logits.argmax(-1).tolist()
    one = SamplingParams(temperature=1.0, top_k=1)
    for seed in range(50):
        got = impl.rejection_sample(logits.clone(), [best[:3]], [one], [torch.Generator().manual_seed(seed)])
        assert got == [best], (
            f"top_k = 1 gives each row's argmax probability 1: the drafts {best[:3]} (the argmax of "
            f"rows 0..2) are always accepted, then the bonus {best[3]}; yours {got}"
        )


def within_noise(counts: Counter, probs: torch.Tensor, n: int) -> list[str]:
    """The tokens whose frequency in n draws is more than 5 standard deviations (plus 0.005) from probs."""
    far = []
    for token, p in enumerate(probs.tolist()):
        freq = counts.get(token, 0) / n
        if abs(freq - p) > 5 * math.sqrt(p * (1 - p) / n) + 0.005:
            far.append(f"token {token}: {freq:.3f} drawn, probability {p:.3f}")
    return far


def check_sampled_distribution(impl):
    """Whatever the draft (the likeliest token, an unlikely one, one outside top-k/top-p), the first token a verify
    step emits is distributed as p, row 0's filtered distribution; after an accepted first draft, the next one as
    row 1's. n requests share one seeded generator, so the test is deterministic."""
    logits = torch.randn(2, 6, generator=torch.Generator().manual_seed(7)) * 1.5
    n = 3000
    for params in SAMPLED:
        p0 = target_probs(logits[0], params)
        order = p0.argsort(descending=True).tolist()
        for draft in (order[0], order[2], order[-1]):
            gen = torch.Generator().manual_seed(draft)
            runs = impl.rejection_sample(logits.repeat(n, 1), [[draft] for _ in range(n)], [params] * n, [gen] * n)
            far = within_noise(Counter(run[0] for run in runs), p0, n)
            assert not far, (
                f"{describe(params)}, draft {draft} (probability {float(p0[draft]):.3f}), {n} verify steps of one "
                f"request, row 0's logits {[round(x, 2) for x in logits[0].tolist()]}: the first token emitted must "
                f"be distributed as row 0's filtered softmax p, whatever the draft; off by more than sampling noise: "
                f"{'; '.join(far)}"
            )
            bonus = [run[1] for run in runs if len(run) == 2]
            if len(bonus) > 1000:
                far = within_noise(Counter(bonus), target_probs(logits[1], params), len(bonus))
                assert not far, (
                    f"{describe(params)}, draft {draft}: after the draft is accepted the bonus token is drawn from the "
                    f"next row's (row 1's) filtered softmax; off by more than sampling noise: {'; '.join(far)}"
                )


# ---- 13.4 and 13.5: the scheduler's speculative pieces ---------------------------------------------------------
# Each task grades its own method: the other of the two is the engine's, so 13.4's grade never depends on 13.5.
# Everything else (schedule() above all) is what your Scheduler extends: your chapter 07 Scheduler once chapter 07
# passes its grade, nanoengine's until then (nanocourse/builds_on.py), so the replays below run your 07 policy.
ENGINE_PIECE = {"13.4": "update_request_with_output", "13.5": "scheduled_spec_decode_tokens"}


def scheduler_for(impl, task):
    """Your Scheduler (over what it extends) with the engine's method for the other task (13.6 runs both of
    yours)."""
    other = ENGINE_PIECE[task]
    return type(f"Yours{task.replace('.', '_')}", (impl.Scheduler,), {other: getattr(Scheduler, other)})


def new_scheduler(impl, task, **cfg):
    return scheduler_for(impl, task)(SchedulerConfig(**({"max_num_batched_tokens": 64} | cfg)), KVCacheManager(BS, 64))


def decoding(s, rid="a", prompt=(1, 2, 3, 4, 5), max_tokens=20, eos=0, ignore_eos=False):
    """A request past its prefill with one sampled token (9): num_computed_tokens = num_tokens - 1."""
    request = Request(
        rid,
        list(prompt),
        sampling_params=SamplingParams(max_tokens=max_tokens, ignore_eos=ignore_eos),
        eos_token_id=eos,
        block_hasher=get_request_block_hasher(BS),
    )
    s.add_request(request)
    request.status = RequestStatus.RUNNING
    request.append_output_token_ids(9)
    request.num_computed_tokens = request.num_tokens - 1
    return request


@pytest.mark.task("13.4", "scheduled_spec_decode_tokens: the drafts a step verifies, cut to what it scheduled")
def test_scheduled_drafts(impl):
    """Named examples, then your Scheduler beside the engine's under random workloads, k drafts given to every
    running request each step and verified by a fake greedy model: the drafts verified, the computed tokens, the
    cached blocks and every queue must agree after every step."""
    check_scheduled_drafts_examples(impl)
    replay_with_drafts(impl, "13.4")


def check_scheduled_drafts_examples(impl):
    s = new_scheduler(impl, "13.4")
    a, b, c, d = (decoding(s, rid) for rid in "abcd")
    prompt = Request("p", list(range(10, 20)), sampling_params=SamplingParams(max_tokens=5))
    s.add_request(prompt)
    prompt.num_computed_tokens = 4
    for r, drafts in zip((a, b, c, d, prompt), ([7, 7, 7, 7, 7], [6, 6], [5, 5, 5], [4, 4], [3, 3])):
        r.spec_token_ids = list(drafts)
    # a: 4 tokens (its last verified token and 3 drafts); b: 3 (1 + both drafts); c: 1 (no draft fits); d is not
    # scheduled; the prompt gets a 4-token chunk (tokens 4..7 of 10: no drafts among them).
    scheduled = {"a": 4, "b": 3, "c": 1, "p": 4}
    got = s.scheduled_spec_decode_tokens(dict(scheduled))
    expected = {"a": [7, 7, 7], "b": [6, 6]}
    setup = (
        "requests a, b, c, d decoding (num_computed_tokens = num_tokens - 1) with drafts [7, 7, 7, 7, 7], [6, 6], "
        "[5, 5, 5], [4, 4], and a 10-token prompt p at 4 computed tokens with drafts [3, 3]; scheduled "
        f"{scheduled}"
    )
    emptied = [rid for rid, drafts in (got.items() if isinstance(got, dict) else ()) if drafts == []]
    assert not emptied, (
        f"{setup}: entries {emptied} are [], and no entry is ever []. Did an entry start as the request's own "
        f"spec_token_ids list, emptied in place afterwards? The list a step verifies must not be the one the "
        f"request keeps; yours {got}"
    )
    assert isinstance(got, dict) and got == expected, (
        f"{setup}: a request verifies the drafts among its scheduled tokens past num_tokens (a: 4 - 1 = 3 of its 5; "
        f"b: both; c: none, so no entry; a prompt chunk: none): expected {expected}, yours {got}"
    )
    cleared = {r.request_id: r.spec_token_ids for r in (a, b, c, prompt)}
    assert all(v == [] for v in cleared.values()), (
        f"{setup}: every scheduled request's drafts are used up, verified or not (it holds none once the step is "
        f"scheduled): the step changes its context, and the engine proposes anew after it; yours leaves {cleared}"
    )
    assert d.spec_token_ids == [4, 4], (
        f"{setup}: request d was not scheduled, so its drafts stay for a later step: [4, 4], yours {d.spec_token_ids}"
    )

    # Through schedule(): a budget of 6 tokens cuts request a's 8 drafts to 5.
    s = new_scheduler(impl, "13.4", max_num_batched_tokens=6)
    a = Request(
        "a", [1, 2, 3, 4, 5], sampling_params=SamplingParams(max_tokens=20), block_hasher=get_request_block_hasher(BS)
    )
    s.add_request(a)
    s.update_from_output(s.schedule(), ModelRunnerOutput({"a": [9]}))
    s.update_draft_token_ids({"a": [7] * 8})
    so = s.schedule()
    assert so.scheduled_spec_decode_tokens == {"a": [7] * 5}, (
        f"a decoding request with 8 drafts and a budget of 6 tokens: the step schedules its last token and 5 drafts, "
        f"and verifies those 5: expected {{'a': [7, 7, 7, 7, 7]}}, yours {so.scheduled_spec_decode_tokens}"
    )
    assert a.spec_token_ids == [], f"the scheduled request's drafts are used up; yours leaves {a.spec_token_ids}"


def replay(impl, task, workload):
    cfg, ops = workload
    yours = scheduler_for(impl, task)

    def build(mine: bool) -> Scheduler:
        return (yours if mine else Scheduler)(
            scheduler_config(cfg), KVCacheManager(BS, cfg["num_blocks"], cfg["caching"])
        )

    mine = "scheduled_spec_decode_tokens" if task == "13.4" else "update_request_with_output"
    replay_workload(
        build,
        cfg,
        ops,
        BS,
        f"{cfg['num_blocks'] - 1} usable blocks of {BS} tokens; your {mine} with the engine's {ENGINE_PIECE[task]}, "
        f"on {schedule_owner(impl)}",
        plan_rules=True,
    )


def schedule_owner(impl) -> str:
    """Whose schedule() the replays run: the one your Scheduler extends."""
    owner = next(cls for cls in impl.Scheduler.__mro__ if "schedule" in vars(cls))
    if owner.__module__.startswith("nanoengine."):
        return "the engine's schedule() (the Scheduler yours extends)"
    if owner is impl.Scheduler:
        return "your own schedule()"
    return f"your chapter 07 schedule() ({owner.__module__.replace('.', '/')}.py, the Scheduler yours extends)"


def replay_with_drafts(impl, task):
    @settings(max_examples=300)
    @given(workload=scheduler_workloads(num_speculative_tokens=st.sampled_from([1, 2, 4])))
    def matches(workload):
        replay(impl, task, workload)

    matches()


def verify_step(impl, drafts, new, **kw):
    """A decoding request after a verify step of `drafts` (num_computed_tokens advanced past them), given `new`."""
    cfg = {k: kw.pop(k) for k in ("max_model_len",) if k in kw}
    s = new_scheduler(impl, "13.5", **cfg)
    request = decoding(s, **kw)
    before = list(request.output_token_ids)
    request.num_computed_tokens = request.num_tokens + len(drafts)
    status = s.update_request_with_output(request, list(new), list(drafts))
    return request, status, before


UPDATE_EXAMPLES = [  # (drafts, tokens emitted, request kwargs, output added, status, the rule it shows)
    ([7, 8, 9], [7, 8, 9, 4], {}, [7, 8, 9, 4], None, "all 3 drafts accepted and the bonus token: nothing rolled back"),
    ([7, 8, 9], [7, 6], {}, [7, 6], None, "1 of 3 drafts accepted, then the recovered token: 2 drafts rolled back"),
    ([7, 8, 9], [6], {}, [6], None, "no draft accepted: all 3 rolled back"),
    ([], [4], {}, [4], None, "a plain decode step (no drafts): nothing rolled back"),
    (
        [5, 0, 5],
        [5, 0, 5, 4],
        {},
        [5, 0],
        RequestStatus.FINISHED_STOPPED,
        "EOS (0) is the second token: the request stops there and the tokens after it are dropped",
    ),
    ([5, 0, 5], [5, 0, 5, 4], {"ignore_eos": True}, [5, 0, 5, 4], None, "ignore_eos: EOS does not stop the request"),
    (
        [5, 5],
        [5, 5, 5],
        {"max_tokens": 3},
        [5, 5],
        RequestStatus.FINISHED_LENGTH_CAPPED,
        "max_tokens 3 with 1 output token: the request stops after 2 more, the third is dropped",
    ),
    (
        [5, 5, 5],
        [5, 5, 5, 5],
        {"max_model_len": 8},
        [5, 5],
        RequestStatus.FINISHED_LENGTH_CAPPED,
        "max_model_len 8 and 6 tokens: the request stops at 8 tokens, the rest are dropped",
    ),
    ([0, 5], [6], {}, [6], None, "a rejected draft that was EOS is no stop: only emitted tokens are checked"),
]


@pytest.mark.task("13.5", "update_request_with_output: the output and computed count a run without drafts would have")
def test_update_request_with_output(impl):
    """Named examples, then 13.4's replay: after every verify step the computed tokens, the cached blocks and the
    queues agree with the engine's."""
    check_update_examples(impl)
    replay_with_drafts(impl, "13.5")


def check_update_examples(impl):
    for drafts, new, kw, added, status, rule in UPDATE_EXAMPLES:
        request, got, before = verify_step(impl, drafts, new, **kw)
        where = (
            f"{rule} (a request of 5 prompt tokens and output {before}, num_computed_tokens 5 before the step and "
            f"{5 + 1 + len(drafts)} on entry, having verified drafts {drafts}, then given the tokens {new}"
            f"{', ' + str(kw) if kw else ''})"
        )
        assert request.output_token_ids == before + added, (
            f"{where}: its output becomes {before + added}, yours {request.output_token_ids}"
        )
        assert got == status, f"{where}: returns {status}, yours {got}"
        check_computed_count(request, where)


def check_computed_count(request: Request, where: str) -> None:
    """The count 13.5's contract states, named by the rule a wrong one breaks and never by the value it should have."""
    computed, tokens = request.num_computed_tokens, request.num_tokens
    if computed >= tokens:
        raise AssertionError(
            f"{where}: yours leaves num_computed_tokens {computed} with {tokens} tokens: it counts a slot the "
            f"request's own tokens do not fill (a rejected draft's, or one past a stop), and the request's last "
            f"token always stays to compute"
        )
    assert computed == tokens - 1, (
        f"{where}: yours leaves num_computed_tokens {computed} with {tokens} tokens: slots that hold the KV of the "
        f"request's own tokens are left out of the count (was an accepted draft rolled back?)"
    )


# ---- 13.6: in the engine --------------------------------------------------------------------------------------
TINY = LlamaForCausalLM.random(LlamaConfig.tiny(vocab_size=16), seed=0, std=0.2)
SPEC = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 3}
PROMPTS = [
    [3, 4, 5, 6] * 4,
    [3, 4, 5, 6] * 3 + [7, 8],
    [7, 8, 7, 8, 9] * 3,
    [10, 11, 12, 10, 11] * 2 + [13],
    [3, 4, 5, 6] * 4,
]


def check_cached_blocks(engine, hasher, step):
    """Every cached block a running request holds carries the hash of its verified tokens: no rejected draft."""
    manager = engine.kv_cache_manager.coordinator.single_type_managers[0]
    for req_id, request in engine.scheduler.requests.items():
        if request.status is not RequestStatus.RUNNING or req_id not in manager.num_cached_block:
            continue
        num_cached = manager.num_cached_block[req_id]
        assert num_cached * BS <= request.num_tokens, (
            f"step {step}: request {req_id} has {num_cached} cached blocks ({num_cached * BS} tokens) but only "
            f"{request.num_tokens} verified tokens: a block holding a draft was cached"
        )
        verified = Request("check", request.all_token_ids, block_hasher=hasher).block_hashes
        for i, block in enumerate(manager.req_to_blocks[req_id][:num_cached]):
            assert block.block_hash is None or block.block_hash == make_block_hash_with_group_id(verified[i], 0), (
                f"step {step}: request {req_id}'s cached block {i} does not hold the hash of its verified tokens "
                f"{request.all_token_ids[i * BS : (i + 1) * BS]}: it was cached with a token that is not the request's"
            )
        assert request.num_computed_tokens < request.num_tokens, (
            f"step {step}: request {req_id} has num_computed_tokens {request.num_computed_tokens} but "
            f"{request.num_tokens} verified tokens: after a step it covers every token but the last, rejected "
            f"drafts rolled back"
        )


def checked(scheduler_cls: type[Scheduler], stops_among_drafts: Counter) -> type[Scheduler]:
    """The Scheduler checked, at every step in the engine, against what 13.4 and 13.5 promise: every request a step
    schedules leaves schedule() with no drafts, and every update leaves num_computed_tokens at num_tokens - 1.
    Each stop that drops tokens the step emitted (a stop among the accepted drafts) is counted in
    stops_among_drafts by its status, so that a run can tell it met one."""

    class Checked(scheduler_cls):
        def schedule(self):
            output = super().schedule()
            kept = {r: self.requests[r].spec_token_ids for r in output.num_scheduled_tokens}
            kept = {r: drafts for r, drafts in kept.items() if drafts}
            assert not kept, (
                f"scheduled {output.num_scheduled_tokens}, these requests leave the step's schedule() still holding "
                f"drafts {kept}: every scheduled request's drafts are used up, verified or not, also when the step "
                f"feeds it no draft (a budget that left room for its last verified token only)"
            )
            return output

        def update_request_with_output(self, request, new_token_ids, spec_token_ids, *args, **kwargs):
            before = request.num_tokens
            status = super().update_request_with_output(request, new_token_ids, spec_token_ids, *args, **kwargs)
            where = f"request {request.request_id} verified drafts {spec_token_ids}, then given {new_token_ids}"
            if status is not None:
                where += f" and stopped ({status.name}) after {request.num_tokens - before} of them"
                stops_among_drafts[status] += request.num_tokens - before < len(new_token_ids)
            check_computed_count(request, where)
            return status

    return Checked


def serve(seams, spec, name, prompts=PROMPTS, stop_token_ids=(), **kwargs):
    """Greedy tokens of prompts, twice (the second time with prefix hits), checking the cached blocks every step;
    a request ends at max_tokens or at one of stop_token_ids (the tiny model has no tokenizer, so no EOS). name: the
    run, as messages call it."""
    llm = LLM(
        TINY,
        block_size=BS,
        num_gpu_blocks_override=48,
        max_num_seqs=4,
        progress=False,
        speculative_config=spec,
        **seams,
        **kwargs,
    )
    engine, hasher = llm.engine, get_request_block_hasher(BS)
    outputs, step = [], 0
    for _ in range(2):
        ids = [
            engine.add_request(
                p, SamplingParams(temperature=0, max_tokens=16 + 3 * i, stop_token_ids=list(stop_token_ids))
            )
            for i, p in enumerate(prompts)
        ]
        done = {}
        while engine.has_unfinished_requests():
            step += 1
            try:
                outs = engine.step()
            except (NotImplementedError, AssertionError):  # not implemented, or a contract checked() found broken
                raise
            except Exception as error:  # a crash inside the engine: say which step, and what usually causes it
                raise AssertionError(
                    f"with {name}, step {step}: the engine raised {type(error).__name__}: {error} "
                    f"(a verify step gets len(drafts) + 1 rows of logits per request, the drafts your "
                    f"scheduled_spec_decode_tokens returned: are they cut to the tokens scheduled?)"
                ) from error
            done.update((o.request_id, o.outputs[0].token_ids) for o in outs)
            check_cached_blocks(engine, hasher, step)
        outputs.append([done[r] for r in ids])
    pool = engine.kv_cache_manager.block_pool
    assert pool.get_num_free_blocks() == pool.num_gpu_blocks - 1, (
        f"with {name}: every block is back in the pool once every request has finished "
        f"({pool.num_gpu_blocks - 1} free), yours leaves {pool.get_num_free_blocks()}"
    )
    return outputs, llm.get_stats()


# PROMPTS[0] and the first 11 tokens the tiny model emits greedily after it: the next are 8, then 2 and 10, and the
# n-gram proposer drafts [2, 8, 9] after the 8, so a stop token 2 (an EOS) arrives as an accepted draft, 10 behind it.
STOP_AMONG_DRAFTS = PROMPTS[0] + [8, 2, 8, 9, 14, 10, 13, 11, 11, 6, 10]
RUNS = [  # (what the run is called, serve's arguments)
    ("a roomy budget", {}),
    ("a budget of 6 tokens", {"max_num_batched_tokens": 6}),  # chunked prompts, drafts cut, last-token-only steps
    (
        "stop token 2 (it lands among accepted drafts)",
        {"prompts": [*PROMPTS, STOP_AMONG_DRAFTS], "stop_token_ids": [2]},
    ),
]


@pytest.mark.task("13.6", "in the engine: the tokens of speculation off, no rejected draft cached, no leak")
def test_your_parts_serve_with_speculation(impl):
    """Your three parts in the engine beside plain decoding, in each of RUNS; 13.4's and 13.5's contracts are
    checked at every step."""
    stops_among_drafts: Counter = Counter()
    seams = {
        "proposer_cls": impl.NgramProposer,
        "rejection_sampler": impl.rejection_sample,
        "scheduler_cls": checked(impl.Scheduler, stops_among_drafts),
    }
    for name, kwargs in RUNS:
        want_all, _ = serve({}, None, name, **{k: v for k, v in kwargs.items() if k != "max_num_batched_tokens"})
        got, stats = serve(seams, SPEC, name, **kwargs)
        for run, (mine, want) in enumerate(zip(got, want_all)):
            for i, (m, w) in enumerate(zip(mine, want)):
                assert m == w, (
                    f"with {name}, {'the first run' if run == 0 else 'the second run (prefix hits)'}, "
                    f"prompt {kwargs.get('prompts', PROMPTS)[i]}: greedy tokens with speculation must equal those without, {w}; yours {m}"
                )
        assert 0 < stats.num_accepted_tokens < stats.num_draft_tokens, (
            f"with {name}: these repetitive prompts give drafts, some accepted and some rejected "
            f"(the engine's own parts accept part of them); yours: {stats.num_draft_tokens} drafts, "
            f"{stats.num_accepted_tokens} accepted"
        )
    assert stops_among_drafts[RequestStatus.FINISHED_STOPPED] > 0, (
        "the run with stop token 2 met no stop among accepted drafts, so it checked nothing of the kind: "
        "did your proposer or rejection sampler draft or accept less than the engine's would?"
    )


# ---- 13.7: an open design, graded by a measured outcome ---------------------------------------------------------
class _AcceptRateTimesKMax:
    """The first idea most designs start from, measured only for the message: the request's acceptance rate so far
    (drafts accepted over drafts proposed) times K_MAX, K_MAX at its first step."""

    def num_drafts(self, history):
        proposed = sum(k for k, _ in history)
        return round(K_MAX * sum(a for _, a in history) / proposed) if proposed else K_MAX


@pytest.mark.task("13.7", "your draft length: more tokens per unit of step cost than the bar, above every fixed k")
def test_draft_length_design(impl):
    spec_design.replay(impl.DraftLengthDesign, TRACES[0])  # a choice outside 0..K_MAX raises ValueError here, naming it
    yours, bar_value = measure(impl.DraftLengthDesign), bar()
    best_k, best_value = best_fixed()
    if yours <= bar_value:
        naive = measure(_AcceptRateTimesKMax)
        worst = sorted(
            range(len(TRACES)),
            key=lambda i: measure(impl.DraftLengthDesign, [TRACES[i]]) - measure(fixed(best_k), [TRACES[i]]),
        )[:3]
        pytest.fail(
            f"tokens per unit of step cost over the {len(TRACES)} traces of nanocourse.spec_design.TRACES: yours "
            f"{yours:.3f}; the bar is more than {bar_value:.3f} ({BAR_FACTOR} times the best fixed k's "
            f"{best_value:.3f}, k = {best_k} at every step, vLLM's rule). The acceptance rate so far times K_MAX "
            f"reaches {naive:.3f}: a "
            f"record summed from the first step on answers slowly when a request's text changes. What does the last "
            f"step's outcome say about the next, and what does a request with no drafts learn? Where yours loses most "
            f"to k = {best_k}: traces "
            + ", ".join(f"TRACES[{i}]" for i in worst)
            + " (replay(DraftLengthDesign, TRACES[i]).steps shows your choices)"
        )
