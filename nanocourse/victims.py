"""Task 07.10's bench: replay tight-pool workloads on a scheduler class, without a model, and measure what its
victim choice cost. The bar a design must clear is `bar()`: BAR_FRACTION of the tokens vLLM's rule (the newest
admitted first) recomputes over WORKLOADS.

The workloads are honest about output lengths: about two in five of the drawn requests (STOP_SHARE) and one
written by hand stop on EOS before their max_tokens, at a point no scheduler can know in advance, so max_tokens
bounds what a request will still claim without forecasting it.

Measured over WORKLOADS, as a fraction of what vLLM's rule recomputes: rules that look only at what a victim has
done or holds recompute as much or more (the fewest full blocks first 1.02, the fewest tokens in the last partial
block 1.03, each the newest on a tie; the fewest computed 1.05; the most blocks 1.47; the oldest admitted 1.53);
rules that also weigh what a victim would still claim from the pool, reading max_tokens for its output, recompute
less (its claim less its computed tokens 0.87, the worked solution's horizon-capped claim less its computed tokens
0.88, its claim per computed token 0.90; the same with the earliest arrival always spared, 0.94 to 0.97, two of
them above the bar). The bar, 0.95, lies between the two groups. With every request generating exactly its
max_tokens (STOP_SHARE 0, no early stop by hand) the look-ahead rules came out at 0.83 to 0.85: early stops cost
them a few percent, not their lead. On 40 other seeds the groups stay apart (0.97 to 1.63 against 0.87 to 0.90,
the spared-earliest variants 0.89 to 0.90), but the fewest computed first lands at 0.97 there, 0.02 above the
bar: a margin of a few percent, not a law.

A replay is the engine's step loop with the model left out (every request whose tokens are all computed samples
token 1, or EOS where it stops early), so it takes milliseconds and depends on nothing but the scheduler. Each
plan is checked as schedule() hands it over (nanocourse.plan_rules): the budget, the pool never over-committed, a
victim planned for nothing.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from nanocourse.plan_rules import checked_schedule
from nanocourse.timeline import split_kinds
from nanoengine.core import KVCacheManager, get_request_block_hasher
from nanoengine.core.sched.scheduler import Scheduler, SchedulerConfig
from nanoengine.request import Request
from nanoengine.sampling_params import SamplingParams
from nanoengine.worker.outputs import ModelRunnerOutput

BLOCK_SIZE = 4
MAX_STEPS = 400  # the longest workload takes about 160 steps; a run still going at 400 is starving someone

BAR_FRACTION = 0.95  # of vLLM's recompute; see the module docstring for what lies on either side
STOP_SHARE = 0.4  # of the drawn requests, those that stop (on EOS) before their max_tokens
EOS = 2  # every request's EOS token; replay samples it as an early stopper's last token, token 1 before it

# (request id, prompt tokens, max_tokens, output tokens it generates): output < max_tokens stops early on EOS,
# which no scheduler can know in advance; output == max_tokens runs to its max_tokens.
Arrival = tuple[str, int, int, int]


def mixed_workload(seed: int, stop_share: float = STOP_SHARE) -> tuple[int, dict[int, list[Arrival]]]:
    """A random tight-pool workload: 4 to 7 requests (prompts of 6 to 40 tokens, max_tokens 2 to 48) arriving 0 to
    5 steps apart, in a pool with room for the longest request at its max_tokens plus 2 to 10 blocks, so that every
    one can run alone and most runs must preempt. Each request stops early with probability `stop_share`, after a
    uniform 1 to max_tokens - 1 tokens; those draws come from a stream of their own, so `stop_share=0` gives the same
    prompts, max_tokens and arrivals with every request generating its max_tokens."""
    rng, stops = random.Random(seed), random.Random(f"stops {seed}")
    arrivals: dict[int, list[Arrival]] = {}
    step = longest = 0
    for i in range(rng.randint(4, 7)):
        prompt, max_tokens = rng.randint(6, 40), rng.randint(2, 48)
        early = stops.random() < stop_share
        output = stops.randint(1, max_tokens - 1) if early else max_tokens
        arrivals.setdefault(step, []).append((f"r{i}", prompt, max_tokens, output))
        longest = max(longest, prompt + max_tokens)
        step += rng.choice([0, 0, 1, 2, 3, 5])
    room = -(-longest // BLOCK_SIZE) + 2
    return rng.randint(room, room + 8) + 1, arrivals


# name -> (usable blocks + 1, {step: [Arrival]}): pools too small for everything at once, prompts that share no
# block, budget 16 and threshold 4 (the notebook's tight run, scaled down to blocks of 4); three written by hand,
# then 40 drawn by mixed_workload. In "two late arrivals" r1 asks for 30 tokens and stops after 7: the claim less
# computed rule, reading 30, takes it as the victim twice, each time a token or two from its end (4 preemptions, 41
# tokens recomputed), where vLLM's rule lets it finish at step 8 and free its blocks (2 preemptions, 21 tokens).
WORKLOADS = {
    "four prompts at once": (24, {0: [("r0", 26, 20, 20), ("r1", 27, 20, 20), ("r2", 26, 20, 20), ("r3", 27, 8, 8)]}),
    "two late arrivals": (
        21,
        {0: [("r0", 40, 12, 12), ("r1", 12, 30, 7)], 3: [("r2", 30, 10, 10), ("r3", 20, 16, 16)]},
    ),
    "a chat's trickle": (
        20,
        {
            0: [("r0", 30, 16, 16), ("r1", 8, 24, 24)],
            2: [("r2", 24, 12, 12)],
            5: [("r3", 16, 20, 20), ("r4", 10, 8, 8)],
        },
    ),
    **{f"mixed {seed}": mixed_workload(seed) for seed in range(40)},
}

# Built to starve, and graded for that alone (not in the bar): a long prompt among a stream of short ones. A victim
# order with no guard against choosing the same request again (the most still to claim, say) takes the long one
# at every preemption, and it finishes only once the stream stops.
STARVING = {
    "a long prompt among short ones": (
        14,
        {0: [("r0", 40, 16, 16)], **{1 + 3 * i: [(f"r{i + 1}", 8, 6, 6)] for i in range(12)}},
    ),
}


@dataclass(frozen=True, slots=True)
class Replay:
    """One workload's run: steps taken, preemptions, tokens computed a second time, the step each request
    arrived and finished (None: never), and the blocks still held when it ended (0 unless a block leaked)."""

    workload: str
    steps: int
    preemptions: int
    recomputed: int
    finished: dict[str, int | None]
    blocks_held: int
    arrived: dict[str, int]

    def longest_stay(self) -> int:
        """The most steps any request spent from its arrival to its finish (MAX_STEPS for one that never did)."""
        return max((MAX_STEPS if at is None else at) - self.arrived[rid] for rid, at in self.finished.items())


def sample(request: Request, output: int) -> int:
    """The token a request samples next: EOS as its `output`-th when that is before its max_tokens, else token 1."""
    last = len(request.output_token_ids) + 1 == output < request.sampling_params.max_tokens
    return EOS if last else 1


def replay(scheduler_cls: type, workload: str) -> Replay:
    """Run `scheduler_cls` (a subclass of the engine's Scheduler) on one of WORKLOADS or STARVING, FCFS, prefix
    caching on."""
    num_blocks, arrivals = {**WORKLOADS, **STARVING}[workload]
    s = scheduler_cls(
        SchedulerConfig(max_num_batched_tokens=16, long_prefill_token_threshold=4),
        KVCacheManager(BLOCK_SIZE, num_blocks, True),
    )
    hasher = get_request_block_hasher(BLOCK_SIZE)
    high_water: dict[str, int] = {}  # the furthest position each request ever had computed
    recomputed = preemptions = step = 0
    finished: dict[str, int | None] = {}
    outputs: dict[str, int] = {}  # the output tokens each request generates before it stops
    while step < MAX_STEPS and (step <= max(arrivals) or s.has_unfinished_requests()):
        for rid, n, max_tokens, out in arrivals.get(step, ()):
            finished[rid] = None
            outputs[rid] = out
            prompt = [(17 * int(rid[1:]) + 7 * j) % 250 for j in range(n)]  # no two prompts share a block
            params = SamplingParams(max_tokens=max_tokens)
            s.add_request(Request(rid, prompt, sampling_params=params, eos_token_id=EOS, block_hasher=hasher))
        so = checked_schedule(s, where=f"{workload!r}, step {step}")
        preemptions += len(so.preempted_req_ids)
        for rid, n in so.num_scheduled_tokens.items():
            request = s.requests[rid]
            start = request.num_computed_tokens - n  # schedule() has already advanced it
            recomputed += split_kinds(start, n, high_water.get(rid, 0), request.num_prompt_tokens)[1]
            high_water[rid] = max(high_water.get(rid, 0), start + n)
        done = {
            r: [sample(s.requests[r], outputs[r])]
            for r in so.num_scheduled_tokens
            if s.requests[r].num_computed_tokens == s.requests[r].num_tokens
        }
        finished.update((r.request_id, step) for r in s.update_from_output(so, ModelRunnerOutput(done)))
        step += 1
    pool = s.kv_cache_manager.block_pool
    arrived = {rid: at for at, requests in arrivals.items() for rid, *_ in requests}
    held = pool.num_gpu_blocks - 1 - pool.get_num_free_blocks()
    return Replay(workload, step, preemptions, recomputed, finished, held, arrived)


def measure(scheduler_cls: type) -> list[Replay]:
    """Every workload, replayed on `scheduler_cls`."""
    return [replay(scheduler_cls, name) for name in WORKLOADS]


class FewestComputedFirst(Scheduler):
    """The first idea most victim designs start from: the running request with the fewest computed tokens loses
    least, so it is the victim (the earliest admitted on a tie). It looks only at what a request has done, never at
    what it will still claim, and recomputes more than vLLM's rule over WORKLOADS."""

    def choose_victim(self) -> Request:
        victim = min(self.running, key=lambda r: r.num_computed_tokens)
        self.running.remove(victim)
        return victim


def bar() -> int:
    """Task 07.10's bar: BAR_FRACTION of the tokens vLLM's rule recomputes over WORKLOADS, rounded down; a design
    must recompute fewer."""
    return int(BAR_FRACTION * sum(r.recomputed for r in measure(Scheduler)))
