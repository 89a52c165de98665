"""Chapter 09's experiments and widgets: eviction policies, radix tree vs hash map, the timing side
channel that cache_salt closes, and cache-aware routing over replicas.

Sweeps run on model-free replicas: the real LLMEngine, Scheduler, KVCacheManager and BlockPool with
a stand-in runner that samples token 0 instead of running the model. Hit rates, evictions and events
are exactly the engine's; only time is not. Real-engine runs pass LLM objects to the same functions.
"""

from __future__ import annotations

import html
import random
import time
import tracemalloc
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import ipywidgets as widgets

from nanocourse.live import show_view
from nanocourse.policies import (
    CacheAwareRouter,
    FrequencyAwareBlockPool,
    RadixTree,
    ReplicaCluster,
    RoundRobinRouter,
    Routed,
    prefix_match,
    run_requests,
)
from nanoengine.core import BlockPool, KVCacheManager, get_request_block_hasher
from nanoengine.core.sched.scheduler import Scheduler, SchedulerConfig
from nanoengine.engine.llm_engine import LLMEngine
from nanoengine.request import Request
from nanoengine.sampling_params import SamplingParams
from nanoengine.worker.outputs import ModelRunnerOutput

GREEDY_ONE = SamplingParams(temperature=0, max_tokens=1)
BLOCK = 16
HASHER = get_request_block_hasher(BLOCK)  # the engine's own: fixed seed, xxhash
PoolFactory = Callable[[int, bool], BlockPool]
POLICIES: dict[str, PoolFactory] = {
    "LRU": lambda n, caching: BlockPool(n, caching, enable_kv_cache_events=True),
    "frequency-aware": lambda n, caching: FrequencyAwareBlockPool(n, caching, enable_kv_cache_events=True),
}
ROUTERS = {"round-robin": RoundRobinRouter, "cache-aware": CacheAwareRouter}


# ---- a replica without a model ------------------------------------------------------------------
class _ModelFreeRunner:
    """Samples token 0 for every request whose prompt the step completes, as ModelRunner would."""

    drafter = None  # no draft model proposes in this runner (LLMEngine asks)

    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler

    def execute_model(self, so) -> ModelRunnerOutput:
        reqs = self.scheduler.requests
        return ModelRunnerOutput(
            {r: [0] for r in so.num_scheduled_tokens if reqs[r].num_computed_tokens >= reqs[r].num_tokens}
        )


class ModelFreeReplica:
    """An engine without a model: `.engine` is a real LLMEngine over a real Scheduler and pool."""

    def __init__(
        self,
        num_blocks: int,
        block_pool: PoolFactory = POLICIES["LRU"],
        block_size: int = BLOCK,
        max_num_batched_tokens: int = 8192,
        long_prefill_token_threshold: int = 0,
    ) -> None:
        manager = KVCacheManager(block_size, block_pool(num_blocks, True))
        config = SchedulerConfig(
            max_num_batched_tokens=max_num_batched_tokens, long_prefill_token_threshold=long_prefill_token_threshold
        )
        scheduler = Scheduler(config, manager)
        self.engine = LLMEngine(_ModelFreeRunner(scheduler), scheduler, None)  # no tokenizer: max_tokens ends requests

    def get_stats(self):
        return self.engine.stats


def pool_of(replica: Any) -> BlockPool:
    return replica.engine.kv_cache_manager.block_pool


def random_tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(1000, 40000) for _ in range(n)]


def hit_rate(outputs: Sequence[Any]) -> float:
    """Cached prompt tokens over prompt tokens, as the engine's prefix-cache stats count them."""
    total = sum(len(o.prompt_token_ids) for o in outputs)
    return sum(o.num_cached_tokens for o in outputs) / total if total else 0.0


def serve_one_by_one(replica: Any, prompts: Sequence[Sequence[int]], params: SamplingParams = GREEDY_ONE) -> list[Any]:
    """Each request alone, in order: the next arrives when the previous one has finished."""
    return [run_requests(replica.engine, [p], params)[0] for p in prompts]


# ---- (a) eviction: a hot system prompt among bursts of one-off prompts --------------------------
@dataclass(frozen=True, slots=True)
class BurstyWorkload:
    """Rounds of chat requests (a hot system prompt plus a question) each followed by a burst of
    one-off long prompts. With num_phases > 1 the hot prompt changes that many times."""

    num_rounds: int = 12
    burst_size: int = 3
    chats_per_round: int = 3
    system_tokens: int = 256
    question_tokens: int = 24
    burst_tokens: int = 384
    num_phases: int = 1
    seed: int = 0

    def build(self) -> tuple[list[list[int]], list[tuple[str, list[int]]]]:
        """(the hot system prompts, [(kind, token ids)] in arrival order); kind is 'chat' or 'burst'."""
        rng = random.Random(self.seed)
        systems = [random_tokens(rng, self.system_tokens) for _ in range(self.num_phases)]
        items = []
        for r in range(self.num_rounds):
            system = systems[r * self.num_phases // self.num_rounds]
            items += [("chat", system + random_tokens(rng, self.question_tokens)) for _ in range(self.chats_per_round)]
            items += [("burst", random_tokens(rng, self.burst_tokens)) for _ in range(self.burst_size)]
        return systems, items


@dataclass(slots=True)
class PolicyRun:
    """One eviction policy on one workload: every request's output, and the replica left behind."""

    policy: str
    kinds: list[str]
    outputs: list[Any]
    replica: Any

    @property
    def hit_rate(self) -> float:
        return hit_rate(self.outputs)

    @property
    def chat_hit_rate(self) -> float:
        return hit_rate([o for k, o in zip(self.kinds, self.outputs) if k == "chat"])


def run_policy(
    policy: str, workload: BurstyWorkload, num_blocks: int, replica: Any = None, params: SamplingParams = GREEDY_ONE
) -> PolicyRun:
    """Serve the workload one request at a time on replica (default: a model-free one with the policy)."""
    replica = replica or ModelFreeReplica(num_blocks, POLICIES[policy])
    _, items = workload.build()
    outputs = serve_one_by_one(replica, [tokens for _, tokens in items], params)
    return PolicyRun(policy, [kind for kind, _ in items], outputs, replica)


def sweep_bursts(burst_sizes: Sequence[int], num_blocks: int, **workload) -> dict[str, list[PolicyRun]]:
    """Each policy at each burst size, on model-free replicas."""
    return {
        policy: [run_policy(policy, BurstyWorkload(burst_size=b, **workload), num_blocks) for b in burst_sizes]
        for policy in POLICIES
    }


def block_hashes(tokens: Sequence[int]) -> list[bytes]:
    """The engine's block hashes of a prompt (fixed seed: the same in every replica and router)."""
    return Request("hash", list(tokens), block_hasher=HASHER).block_hashes


def pool_hashes(pool: BlockPool) -> set[bytes]:
    """Every hash the pool can serve a hit from right now."""
    return {block_hash for block_hash, _ in pool.cached_block_hash_to_block.items()}


def cached_prefix_blocks(pool: BlockPool, tokens: Sequence[int]) -> int:
    """How many leading blocks of tokens the pool can still serve."""
    return prefix_match(block_hashes(tokens), pool_hashes(pool))


# ---- (b) radix tree against the block hash map --------------------------------------------------
def manager_for(prompts: Sequence[Sequence[int]]) -> KVCacheManager:
    """A KVCacheManager with room for every block of the prompts: nothing is ever evicted."""
    return KVCacheManager(BLOCK, sum(len(p) // BLOCK + 1 for p in prompts) + 1, log_stats=False)


def cache_prompts(manager: KVCacheManager, prompts: Sequence[Sequence[int]]) -> KVCacheManager:
    """Run each prompt through the manager as the scheduler would: look up, allocate, free."""
    for i, tokens in enumerate(prompts):
        request = Request(str(i), list(tokens), block_hasher=HASHER)
        computed, num = manager.get_computed_blocks(request)
        manager.allocate_slots(request, request.num_tokens - num, num, computed)
        manager.free(request)
    return manager


def hash_map_match(cached: Sequence[int], query: Sequence[int]) -> int:
    """Tokens of query the engine's prefix cache serves after `cached` ran (whole blocks only)."""
    manager = cache_prompts(manager_for([cached]), [cached])
    # The engine never lets a hit cover the last token; query + one token lifts that cap here.
    return manager.get_computed_blocks(Request("query", [*query, 0], block_hasher=HASHER))[1]


def radix_match(cached: Sequence[int], query: Sequence[int]) -> int:
    tree = RadixTree()
    tree.insert(cached)
    return tree.match_prefix(query)


def best_time(fn: Callable[[], Any], number: int, repeat: int = 5) -> float:
    """Seconds per call: the best of `repeat` means over `number` calls (the least disturbed)."""
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(number):
            fn()
        best = min(best, (time.perf_counter() - start) / number)
    return best


def lookup_costs(length: int, seed: int = 0, number: int = 50) -> dict[str, float]:
    """µs per lookup of a `length`-token prompt, cached (hit) and with a different first token (miss).

    'hash map' probes precomputed block hashes, as the engine does (each request is hashed once as
    its tokens arrive); 'hash map + hashing' also hashes the prompt; 'radix' walks the tree.
    """
    prompt = random_tokens(random.Random(seed), length)
    manager = cache_prompts(manager_for([prompt]), [prompt])
    tree = RadixTree()
    tree.insert(prompt)
    costs = {}
    for case, query in (("hit", prompt), ("miss", [7, *prompt[1:]])):
        hashed = Request("q", query, block_hasher=HASHER)
        # Each timed call is a lambda with its request bound as a default, so the three costs carry the same
        # call overhead.
        costs[f"hash map, {case}"] = best_time(lambda hashed=hashed: manager.get_computed_blocks(hashed), number)
        costs[f"hash map + hashing, {case}"] = best_time(
            lambda query=query: manager.get_computed_blocks(Request("q", query, block_hasher=HASHER)), number
        )
        costs[f"radix, {case}"] = best_time(lambda query=query: tree.match_prefix(query), number)
    return {k: v * 1e6 for k, v in costs.items()}


def traced_bytes(build: Callable[[], Any]) -> int:
    """Bytes still allocated after build() returns, while its result is alive."""
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        kept = build()  # noqa: F841  (alive while measured)
        return tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()


def index_bytes(prompts: Sequence[Sequence[int]]) -> dict[str, int]:
    """What each index keeps alive for these prompts, token objects included.

    The hash map keeps hashes and map entries (the KVCacheBlock objects exist either way) and lets
    the token ids go; the radix tree keeps its edges, and so the token ids themselves. Each prompt
    arrives as a fresh list of fresh ints, as it would from a tokenizer.
    """
    packed = [array("q", p) for p in prompts]
    manager = manager_for(prompts)  # its blocks exist before tracing starts

    def fill_radix():
        tree = RadixTree()
        for tokens in packed:
            tree.insert(list(tokens))
        return tree

    return {"hash map": traced_bytes(lambda: cache_prompts(manager, packed)), "radix tree": traced_bytes(fill_radix)}


# ---- (c) the timing side channel --------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Probe:
    """One attacker request: was its guess a victim's prompt, and what did the attacker see?"""

    salted: bool
    correct: bool
    ttft: float
    cached_tokens: int


def side_channel(llm: Any, secrets: Sequence[Sequence[int]], decoys: Sequence[Sequence[int]]) -> list[Probe]:
    """Victims send the secrets; an attacker then probes every secret and decoy once per world.

    Two worlds share one engine, so that machine noise hits both alike: in the shared world nobody
    sends a cache_salt; in the salted one every tenant sends its own, which keeps the worlds apart
    in the cache too. The cache is reset first. Each guess is probed once per world: a probe caches
    its own prompt, so repeating it would prove nothing.
    """
    llm.reset_prefix_cache()
    for i, secret in enumerate(secrets):
        run_requests(llm.engine, [secret, secret], GREEDY_ONE, [None, f"victim-{i}"])
    guesses = [g for pair in zip([(True, s) for s in secrets], [(False, d) for d in decoys]) for g in pair]
    probes = []
    for correct, tokens in guesses:
        for salted in (False, True):
            out = run_requests(llm.engine, [tokens], GREEDY_ONE, ["attacker" if salted else None])[0]
            probes.append(Probe(salted, correct, out.ttft, out.num_cached_tokens))
    return probes


# ---- (d) routing over replicas --------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class TenantWorkload:
    """Waves of requests from several tenants, each with its own system prompt and fresh questions."""

    num_tenants: int = 6
    num_waves: int = 8
    wave_size: int = 3
    system_tokens: int = 112
    question_tokens: int = 12
    seed: int = 0

    def build(self) -> tuple[list[list[int]], list[list[tuple[int, list[int]]]]]:
        """(the system prompts, waves of (tenant, token ids))."""
        rng = random.Random(self.seed)
        systems = [random_tokens(rng, self.system_tokens) for _ in range(self.num_tenants)]
        waves = []
        for _ in range(self.num_waves):
            tenants = [rng.randrange(self.num_tenants) for _ in range(self.wave_size)]
            waves.append([(t, systems[t] + random_tokens(rng, self.question_tokens)) for t in tenants])
        return systems, waves


def serve_waves(
    cluster: ReplicaCluster, waves: Sequence[Sequence[tuple[int, list[int]]]], params: SamplingParams = GREEDY_ONE
) -> list[Routed]:
    results = []
    for wave in waves:
        results += cluster.serve_wave([tokens for _, tokens in wave], params)
    return results


def sweep_tenants(
    tenant_counts: Sequence[int], num_replicas: int, num_blocks: int, **workload
) -> dict[str, list[float]]:
    """Hit rate of each router against the number of tenants, on model-free replicas."""
    rates: dict[str, list[float]] = {name: [] for name in ROUTERS}
    for n in tenant_counts:
        _, waves = TenantWorkload(num_tenants=n, **workload).build()
        for name, router in ROUTERS.items():
            replicas = [ModelFreeReplica(num_blocks) for _ in range(num_replicas)]
            results = serve_waves(ReplicaCluster(replicas, router(num_replicas)), waves)
            rates[name].append(hit_rate([r.output for r in results]))
    return rates


def tenant_blocks(cluster: ReplicaCluster, systems: Sequence[Sequence[int]], from_events: bool) -> list[list[int]]:
    """[replica][tenant]: leading system-prompt blocks each replica holds, as the cache-aware
    router's event-built indexes say (from_events) or as the pools' own maps say."""
    hashes = [block_hashes(system) for system in systems]
    held = cluster.router.indexes if from_events else [pool_hashes(pool_of(r)) for r in cluster.replicas]
    return [[prefix_match(h, replica_held) for h in hashes] for replica_held in held]


# ---- widgets ---------------------------------------------------------------------------------
_KIND_COLORS = {"hot": "#59a14f", "cached": "#f1ce63", "empty": "#f2f2f2"}


def pool_strip(pool: BlockPool, hot: set[bytes]) -> list[tuple[int, str, str]]:
    """The free blocks in eviction order (next to go first) as (block id, kind, segment).

    kind: 'hot' (a block of the hot system prompt), 'cached' (any other hash) or 'empty'.
    segment: the frequency-aware pool's segment, '' for a plain BlockPool.
    """
    segment = getattr(pool, "segment", lambda block: "")
    strip = []
    for block in pool.free_block_queue.get_all_free_blocks():
        kind = "empty" if block.block_hash is None else "hot" if block.block_hash in hot else "cached"
        strip.append((block.block_id, kind, segment(block)))
    return strip


def _strip_html(name: str, strip: list[tuple[int, str, str]]) -> str:
    marks = {"protected": "P", "probation": "p"}
    cells = "".join(
        f"<td title='block {b}: {kind} {seg}' data-kind='{kind}' style='background:{_KIND_COLORS[kind]};"
        f"width:9px;height:16px;font:9px monospace;text-align:center;border:1px solid #fff'>{marks.get(seg, '')}</td>"
        for b, kind, seg in strip
    )
    return (
        f"<tr><th style='text-align:right;padding-right:6px;font:12px sans-serif'>{html.escape(name)}</th>{cells}</tr>"
    )


class EvictionExplorer:
    """LRU against the frequency-aware pool on the same bursty workload, one slider away.

    Both policies serve the workload on model-free replicas (the real engine loop and pools). The
    table shows the engine's hit rates; the strips show each pool afterwards in eviction order,
    leftmost next: hot system-prompt blocks green, other cached blocks yellow, empty grey;
    P/p mark the frequency-aware pool's protected and probation segments.
    """

    def __init__(self, num_blocks: int = 65, burst_size: int = 3, max_burst: int = 6, **workload: Any) -> None:
        self.workload = workload
        self.burst = widgets.IntSlider(value=burst_size, min=0, max=max_burst, description="burst size")
        self.blocks = widgets.IntSlider(value=num_blocks - 1, min=32, max=128, step=8, description="pool blocks")
        self.table, self.strips = widgets.HTML(), widgets.HTML()
        for slider in (self.burst, self.blocks):
            slider.observe(lambda _: self.refresh(), names="value")
        self.widget = widgets.VBox([widgets.HBox([self.burst, self.blocks]), self.table, self.strips])
        self.refresh()

    def refresh(self) -> None:
        workload = BurstyWorkload(burst_size=self.burst.value, **self.workload)
        (system, *_), _ = workload.build()
        self.runs = {p: run_policy(p, workload, self.blocks.value + 1) for p in POLICIES}
        self.hot_cached = {p: cached_prefix_blocks(pool_of(run.replica), system) for p, run in self.runs.items()}
        hot = set(block_hashes(system))
        self.pool_strips = {p: pool_strip(pool_of(run.replica), hot) for p, run in self.runs.items()}
        self.table.value = self._table_html(len(system) // BLOCK)
        self.strips.value = (
            "<table style='border-collapse:collapse'>"
            + "".join(_strip_html(p, s) for p, s in self.pool_strips.items())
            + "</table>"
        )

    def _table_html(self, hot_blocks: int) -> str:
        rows = "".join(
            f"<tr><td>{p}</td><td>{run.hit_rate:.1%}</td><td>{run.chat_hit_rate:.1%}</td>"
            f"<td>{self.hot_cached[p]} / {hot_blocks}</td></tr>"
            for p, run in self.runs.items()
        )
        head = (
            "<tr><th>policy</th><th>hit rate, all tokens</th><th>hit rate, chat requests</th>"
            "<th>hot prompt blocks still cached</th></tr>"
        )
        return f"<table style='font:12px sans-serif'>{head}{rows}</table>"

    def _ipython_display_(self) -> None:
        show_view(self)


class RouterView:
    """Model-free replicas behind a router: each click sends the next wave of tenant requests.

    The grid shows, per replica and tenant, how many leading blocks of the tenant's system prompt
    the replica's pool holds; for the cache-aware router it is read from the router's event-built
    indexes, and `in_sync` checks it against the pools' own maps.
    """

    def __init__(
        self, workload: TenantWorkload = TenantWorkload(num_waves=12), num_replicas: int = 3, num_blocks: int = 17
    ) -> None:
        self.systems, self.waves = workload.build()
        self.num_replicas, self.num_blocks = num_replicas, num_blocks
        self.choice = widgets.ToggleButtons(options=list(ROUTERS), value="cache-aware", description="router")
        self.next_button = widgets.Button(description="send next wave")
        self.reset_button = widgets.Button(description="reset")
        self.view = widgets.HTML()
        self.next_button.on_click(lambda _: self.step())
        self.reset_button.on_click(lambda _: self.reset())
        self.choice.observe(lambda _: self.reset(), names="value")
        self.widget = widgets.VBox([self.choice, widgets.HBox([self.next_button, self.reset_button]), self.view])
        self.reset()

    def reset(self) -> None:
        replicas = [ModelFreeReplica(self.num_blocks) for _ in range(self.num_replicas)]
        self.cluster = ReplicaCluster(replicas, ROUTERS[self.choice.value](self.num_replicas))
        self.results: list[Routed] = []
        self.last: list[tuple[int, Routed]] = []
        self.render()

    def step(self) -> None:
        if len(self.results) // len(self.waves[0]) >= len(self.waves):
            return
        wave = self.waves[len(self.results) // len(self.waves[0])]
        routed = self.cluster.serve_wave([tokens for _, tokens in wave], GREEDY_ONE)
        self.last = [(tenant, r) for (tenant, _), r in zip(wave, routed)]
        self.results += routed
        self.render()

    @property
    def hit_rate(self) -> float:
        return hit_rate([r.output for r in self.results])

    def render(self) -> None:
        truth = tenant_blocks(self.cluster, self.systems, from_events=False)
        if isinstance(self.cluster.router, CacheAwareRouter):
            self.grid = tenant_blocks(self.cluster, self.systems, from_events=True)
            self.in_sync = self.grid == truth
        else:
            self.grid, self.in_sync = truth, None
        self.view.value = self._grid_html() + self._summary_html()

    def _grid_html(self) -> str:
        full = len(self.systems[0]) // BLOCK
        head = "<tr><th></th>" + "".join(f"<th>tenant {t}</th>" for t in range(len(self.systems))) + "</tr>"
        rows = "".join(
            f"<tr><th>replica {r}</th>"
            + "".join(
                f"<td style='background:{'#59a14f' if n == full else '#c7e9c0' if n else '#f2f2f2'};"
                f"text-align:center'>{n}</td>"
                for n in row
            )
            + "</tr>"
            for r, row in enumerate(self.grid)
        )
        return f"<table style='font:12px sans-serif'>{head}{rows}</table>"

    def _summary_html(self) -> str:
        sent = "; ".join(
            f"tenant {t} → replica {r.replica} ({r.output.num_cached_tokens} cached)" for t, r in self.last
        )
        waves = len(self.results) // len(self.waves[0])
        source = {True: "router's view = pools' maps", False: "router's view differs!", None: "pools' maps"}[
            self.in_sync
        ]
        return (
            f"<div style='font:12px sans-serif'>waves sent: {waves}/{len(self.waves)}; hit rate so far: "
            f"{self.hit_rate:.1%} ({source})<br>last wave: {html.escape(sent) or '-'}</div>"
        )

    def _ipython_display_(self) -> None:
        show_view(self)
