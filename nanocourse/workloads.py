"""Chapter 08's six workloads, measured end to end on the real engine.

Each workload is a fixed list of prompts (token ids) sent one at a time. The generators are
deterministic: text comes from fixed word lists and templates driven by a seeded random.Random, so the
same seed gives the same tokens on every machine. `block_rows` predicts, with the engine's own hasher
and KV cache manager but no model, which blocks of each prompt a sequential run will find cached;
`measure` runs the prompts through two engines (prefix cache on and off) and records hits and TTFTs;
`WorkloadExplorer` shows both, block by block.
"""

from __future__ import annotations

import html
import itertools
import json
import os
import random
import statistics
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import ipywidgets as widgets

from nanocourse.live import show_view
from nanoengine.core import KVCacheManager, get_request_block_hasher
from nanoengine.request import Request
from nanoengine.sampling_params import SamplingParams

# The chatbot benchmark's conversation (bench/engine.py), which chapter 08's chatbot workload reuses.
SYSTEM_PROMPT = """You are Ada, the support assistant of Northwind Rail, a regional train operator.
Follow these rules in every answer.
1. Tone. Be warm, brief and concrete. Use plain words. Never blame the passenger. If you do not know an
answer, say so and point to the right desk instead of guessing.
2. Tickets. Single tickets are valid for one journey on the date printed. Return tickets are valid for the
outward journey on the date printed and for the return within one calendar month. Season tickets cover
unlimited travel between the two named stations, including intermediate stops. Children under five travel
free; children from five to fifteen pay half fare. A railcard gives one third off off-peak fares and must
be carried on the journey.
3. Peak times. Peak trains are those that arrive in the city centre between 06:30 and 09:30, or leave it
between 16:00 and 19:00, on weekdays. Off-peak tickets are not valid on peak trains; a passenger who boards
one must pay the difference to the conductor.
4. Delays and refunds. For a delay of 15 to 29 minutes, passengers can claim 25 percent of the single fare;
30 to 59 minutes, 50 percent; 60 minutes or more, the full single fare. Claims are made online within 28
days, with a photo of the ticket. Refunds for unused tickets are made at the ticket office, minus an admin
fee of two pounds, up to 28 days after the date of travel.
5. Luggage and bikes. Each passenger may bring two large cases and one small bag. Folding bikes are always
allowed. Full-size bikes travel free outside peak times and need a reservation on intercity services.
Pets on a lead or in a carrier travel free; at most two per passenger.
6. Accessibility. Staff assistance can be booked up to two hours before travel through the Passenger Assist
line. Every station in the network has step-free access except Mill Lane and Old Quay, where staff will
arrange a taxi to the nearest accessible station at no cost.
7. Safety. In an emergency, tell the passenger to use the red alarm handle or call the police on 999. Never
give advice that asks a passenger to cross the tracks or leave a stopped train.
8. Privacy. Never ask for card numbers or passwords. For account problems, refer the passenger to the
online help centre.
9. Format. Answer in at most two sentences unless the passenger asks for detail. Quote prices and times
exactly as written above."""

USER_TURNS = [
    "Can my four-year-old travel for free?",
    "How much do I get back if my train was 40 minutes late?",
    "Is an off-peak ticket valid on the 08:10 into the city?",
    "Can I take my full-size bike on the 17:30 intercity?",
    "How long is a return ticket valid for?",
    "What is the discount with a railcard?",
    "I lost my ticket, can I still claim for a delay?",
    "Does Old Quay station have step-free access?",
    "How many suitcases can I bring?",
    "Can I bring my two dogs?",
    "How do I book help with a wheelchair?",
    "What should I do if someone is taken ill on the train?",
    "Can I get a refund for a ticket I did not use last week?",
    "What counts as a peak train in the evening?",
    "Is my season ticket valid at stations in between?",
    "How do I reset my account password?",
]


STORED_RUN = Path(__file__).resolve().parents[1] / "bench" / "results" / "workloads_cpu.json"

# The table in the blog post "vLLM v1 Prefix Caching: Hash Chains, LRU Eviction, and Hit Rate
# Optimization" (Llama 70B, TP=4, H100): hit-rate range and TTFT-reduction range per workload.
BLOG_POST_TABLE = {
    "chatbot": ((0.92, 0.97), (0.78, 0.78)),
    "multi_turn": ((0.80, 0.95), (0.65, 0.85)),
    "rag": ((0.25, 0.40), (0.10, 0.18)),
    "code": ((0.15, 0.35), (0.08, 0.25)),
    "summarization": ((0.08, 0.15), (0.02, 0.05)),
    "random": ((0.00, 0.02), (0.00, 0.00)),
}

# Sizes per workload at each scale: "notebook" keeps the chapter under a minute on 2 CPU cores; "bench" is
# closer to the blog post's prompt lengths and runs in bench/workloads.py.
SCALES = ("notebook", "bench")
SIZES = {
    "chatbot": ({"n": 5, "system_tokens": 128}, {"n": 8, "system_tokens": 600}),
    "multi_turn": (
        {"n": 5, "system_tokens": 48, "reply_tokens": 20},
        {"n": 8, "system_tokens": 256, "reply_tokens": 40},
    ),
    "rag": ({"n": 5, "passage_tokens": 40, "k": 2, "pool": 8}, {"n": 8, "passage_tokens": 128, "k": 4, "pool": 8}),
    "code": ({"n": 5, "context_tokens": 32, "file_tokens": 112}, {"n": 8, "context_tokens": 192, "file_tokens": 512}),
    "summarization": ({"n": 5, "doc_tokens": 112}, {"n": 8, "doc_tokens": 448}),
    "random": ({"n": 5, "prompt_tokens": 96}, {"n": 8, "prompt_tokens": 448}),
}


def sizes(scale: str) -> dict[str, dict]:
    """Each workload's generator arguments at one scale."""
    return {name: pair[SCALES.index(scale)] for name, pair in SIZES.items()}


_ADJ = [
    "early",
    "late",
    "quiet",
    "crowded",
    "northern",
    "coastal",
    "express",
    "local",
    "weekly",
    "narrow",
    "yellow",
    "old",
    "new",
    "busy",
    "rural",
    "eastern",
    "western",
    "delayed",
    "extra",
    "reserved",
]
_NOUN = [
    "train",
    "station",
    "ticket",
    "platform",
    "timetable",
    "conductor",
    "passenger",
    "carriage",
    "signal",
    "bridge",
    "tunnel",
    "junction",
    "depot",
    "fare",
    "route",
    "bicycle",
    "suitcase",
    "window",
    "engine",
    "driver",
    "village",
    "harbour",
    "market",
    "river",
    "valley",
    "schedule",
    "barrier",
    "kiosk",
    "ramp",
    "lift",
]
_VERB = [
    "reaches",
    "leaves",
    "crosses",
    "serves",
    "connects",
    "follows",
    "passes",
    "joins",
    "replaces",
    "delays",
    "checks",
    "opens",
]
_PREP = ["near", "after", "before", "beside", "beyond", "under", "along", "behind"]

RAG_INSTRUCTIONS = (
    "You answer questions for the Northwind Rail help desk. Use only the numbered passages in the user's "
    "message. After each claim, cite the passage it comes from in brackets, like [2]. If the passages do not "
    "contain the answer, say that you cannot find it and do not guess. Keep every answer under three "
    "sentences and quote times, prices and station names exactly as the passages give them."
)
SUMMARY_INSTRUCTION = (
    "Summarize the report below in three short bullet points for a manager who has not read it. "
    "Keep names and numbers exact."
)


@dataclass(frozen=True, slots=True)
class Workload:
    """A named list of prompts, sent in this order, one at a time."""

    name: str
    title: str
    shares: str  # what the prompts have in common, in words
    prompts: tuple[tuple[int, ...], ...]


# ---- text synthesis: fixed word lists, seeded choices -------------------------------------------
def _sentence(rng: random.Random) -> str:
    c = rng.choice
    return f"The {c(_ADJ)} {c(_NOUN)} {c(_VERB)} the {c(_NOUN)} {c(_PREP)} the {c(_ADJ)} {c(_NOUN)}."


def _grow(tok, piece: Callable[[], str], num_tokens: int, sep: str = "") -> str:
    """Pieces joined by sep, just enough of them to encode to at least num_tokens tokens."""
    text = piece()
    while len(tok.encode(text)) < num_tokens:
        text += sep + piece()
    return text


def prose(tok, rng: random.Random, num_tokens: int) -> str:
    """Seeded sentences, at least num_tokens tokens of them."""
    return _grow(tok, lambda: _sentence(rng), num_tokens, " ")


def _function(rng: random.Random) -> str:
    c = rng.choice
    name, arg = f"{c(_VERB).rstrip('s')}_{c(_NOUN)}", c(_NOUN)
    return (
        f"def {name}(distance, {arg}):\n"
        f'    """The {c(_ADJ)} {c(_NOUN)} fare for one {arg}."""\n'
        f"    base = {rng.randint(2, 9)} * distance + {arg}\n"
        f"    return round(base * {rng.randint(50, 99) / 100}, 2)\n\n"
    )


def _code(tok, rng: random.Random, num_tokens: int) -> str:
    return _grow(tok, lambda: _function(rng), num_tokens)


def _head(text: str, tok, num_tokens: int) -> str:
    """Whole lines of text from the top, at least num_tokens tokens' worth (or all of it)."""
    lines = text.split("\n")
    for i in range(1, len(lines) + 1):
        head = "\n".join(lines[:i])
        if len(tok.encode(head)) >= num_tokens:
            return head
    return text


def _chat(tok, system: str | None, user: str) -> tuple[int, ...]:
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": user}]
    return tuple(tok.encode(tok.apply_chat_template(messages)))


# ---- the six workloads ----------------------------------------------------------------------------
# Each generator takes the tokenizer, the number of requests n (at most 16, the benchmark's questions where
# it uses them), sizes in tokens, and a seed (unused where nothing is drawn). Defaults: the notebook scale.
def chatbot(tok, n: int = 5, system_tokens: int = 128, seed: int = 0) -> Workload:
    """One fixed system prompt (the benchmark's, cut to whole lines), a different short question each."""
    system = _head(SYSTEM_PROMPT, tok, system_tokens)
    return Workload(
        "chatbot",
        "Chatbot, fixed system prompt",
        "the whole system prompt",
        tuple(_chat(tok, system, u) for u in USER_TURNS[:n]),
    )


BIKE_SHOP_SYSTEM = (
    "You are the help desk of a small bicycle shop in Utrecht. Answer in at most two sentences, "
    "give prices in euros, and suggest a visit to the workshop whenever a repair is needed. "
) * 2


def chat_ids(llm, question: str, system: str = BIKE_SHOP_SYSTEM) -> list[int]:
    """The token ids of one question behind a system prompt, as the model's chat template renders them (chapters
    06 and 13 serve these)."""
    return llm.tokenizer.encode(
        llm.apply_chat_template([{"role": "system", "content": system}, {"role": "user", "content": question}])
    )


def conversations(system: str, user_turns: Sequence[str], replies: Sequence[str]) -> list[list[dict]]:
    """The messages of each turn of one chat: turn k resends the system prompt, the k earlier user
    turns with their replies, and user turn k. So every turn's messages start with the previous turn's."""
    history = [{"role": "system", "content": system}]
    turns = []
    for k, user in enumerate(user_turns):
        if k:
            history = history + [{"role": "assistant", "content": replies[k - 1]}]
        history = history + [{"role": "user", "content": user}]
        turns.append(history)
    return turns


def multi_turn(tok, n: int = 5, system_tokens: int = 48, reply_tokens: int = 20, seed: int = 0) -> Workload:
    """One conversation, n turns; each request resends the whole conversation so far. The replies are
    synthesized text, not the model's: max_tokens=1 generates none worth keeping."""
    rng = random.Random(seed)
    replies = [prose(tok, rng, reply_tokens) for _ in range(n - 1)]
    turns = conversations(_head(SYSTEM_PROMPT, tok, system_tokens), USER_TURNS[:n], replies)
    return Workload(
        "multi_turn",
        "Multi-turn chat",
        "everything up to the previous turn",
        tuple(tuple(tok.encode(tok.apply_chat_template(m))) for m in turns),
    )


def rag(tok, n: int = 5, passage_tokens: int = 40, k: int = 2, pool: int = 8, seed: int = 0) -> Workload:
    """Fixed instructions, then k passages drawn from a pool for each question, then the question.
    Two requests share more than the instructions only if they retrieved the same first passage(s)."""
    rng = random.Random(seed)
    passages = [prose(tok, rng, passage_tokens) for _ in range(pool)]
    prompts = []
    for question in USER_TURNS[:n]:
        context = "\n".join(f"[{i + 1}] {passages[j]}" for i, j in enumerate(rng.sample(range(pool), k)))
        prompts.append(_chat(tok, RAG_INSTRUCTIONS, f"Passages:\n{context}\n\nQuestion: {question}"))
    return Workload("rag", "RAG, shared instructions", "the instructions (and a passage, by luck)", tuple(prompts))


def code_completion(tok, n: int = 5, context_tokens: int = 32, file_tokens: int = 112, seed: int = 0) -> Workload:
    """Fill-in-the-middle on one file at n cursor positions, in a seeded order: a repository header and
    another file as context, then the code before the cursor, then the code after it. Two requests share
    the header and the file up to the earlier of their cursors; the part after the cursor never lines up."""
    rng = random.Random(seed)
    header = f"<repo_name>northwind/fares<file_sep>units.py\n{_code(tok, rng, context_tokens)}<file_sep>fares.py\n"
    source = _code(tok, rng, file_tokens)
    line_starts = [i + 1 for i, ch in enumerate(source[:-1]) if ch == "\n"]
    cursors = rng.sample(line_starts, n)
    prompts = tuple(
        tuple(tok.encode(f"{header}<fim_prefix>{source[:c]}<fim_suffix>{source[c:]}<fim_middle>")) for c in cursors
    )
    return Workload("code", "Code completion, file context", "the header and the file up to the cursor", prompts)


def summarization(tok, n: int = 5, doc_tokens: int = 112, seed: int = 0) -> Workload:
    """A short fixed instruction, then a different document each. The chat template's default system
    prompt comes first, so it is shared too."""
    rng = random.Random(seed)
    return Workload(
        "summarization",
        "Batch summarization",
        "the template's system prompt and the instruction",
        tuple(_chat(tok, None, f"{SUMMARY_INSTRUCTION}\n\nReport:\n{prose(tok, rng, doc_tokens)}") for _ in range(n)),
    )


def random_prompts(tok, n: int = 5, prompt_tokens: int = 96, seed: int = 0) -> Workload:
    """Unrelated raw text, no chat template: nothing to share."""
    rng = random.Random(seed)
    return Workload(
        "random",
        "Random prompts",
        "nothing",
        tuple(tuple(tok.encode(prose(tok, rng, prompt_tokens))) for _ in range(n)),
    )


GENERATORS = {
    "chatbot": chatbot,
    "multi_turn": multi_turn,
    "rag": rag,
    "code": code_completion,
    "summarization": summarization,
    "random": random_prompts,
}


def make_workloads(tok, scale: str = "notebook", seed: int = 0) -> list[Workload]:
    """The six workloads at one of the SCALES, in the blog post's table order."""
    return [GENERATORS[name](tok, seed=seed, **kwargs) for name, kwargs in sizes(scale).items()]


# ---- prediction: the engine's prefix cache without the model -----------------------------------
HIT, RECOMPUTED, NEW, PARTIAL = "hit", "recomputed", "new", "partial"


@dataclass(frozen=True, slots=True)
class RequestBlocks:
    """What a sequential run does with each block of one prompt: HIT (K/V reused), RECOMPUTED (cached,
    but the last-token rule makes the engine compute it again), NEW (computed, then cached) or PARTIAL
    (the unfilled last block: computed, not cached while it is partial)."""

    num_tokens: int
    blocks: tuple[str, ...]
    block_size: int

    @property
    def hit_tokens(self) -> int:
        return self.blocks.count(HIT) * self.block_size


def block_rows(prompts: Sequence[Sequence[int]], block_size: int = 16) -> list[RequestBlocks]:
    """Run the prompts one at a time through a real KVCacheManager large enough never to evict:
    the hits it reports are the num_cached_tokens the engine will report."""
    hasher = get_request_block_hasher(block_size)
    kv = KVCacheManager(block_size, sum(len(p) // block_size + 1 for p in prompts) + 1)
    rows = []
    for i, ids in enumerate(prompts):
        req = Request(str(i), list(ids), block_hasher=hasher)
        hit_blocks, hit = kv.get_computed_blocks(req)
        num_hit, num_full = len(hit_blocks.blocks[0]), len(req.block_hashes)
        statuses = [HIT] * num_hit + [NEW] * (num_full - num_hit) + [PARTIAL] * (len(ids) % block_size > 0)
        # A cached block right after the hit means the num_tokens - 1 cap, not a miss, ended the walk.
        if num_hit < num_full and kv.block_pool.get_cached_block(req.block_hashes[num_hit]):
            statuses[num_hit] = RECOMPUTED
        kv.allocate_slots(req, len(ids) - hit, hit, hit_blocks)
        kv.free(req)
        rows.append(RequestBlocks(len(ids), tuple(statuses), block_size))
    return rows


def longest_shared_prefix(prompts: Sequence[Sequence[int]]) -> list[int]:
    """For each prompt, the most leading tokens it has in common with any earlier prompt: what a cache
    that stored single tokens, with no last-token rule, could skip."""
    return [max((len(os.path.commonprefix([p, q])) for q in prompts[:i]), default=0) for i, p in enumerate(prompts)]


# ---- measurement ---------------------------------------------------------------------------------
def ttft_reduction(cold_ms: Sequence[float], warm_ms: Sequence[float]) -> float:
    """1 - p50(warm) / p50(cold): the share of the median time to first token that caching removes."""
    return 1 - statistics.median(warm_ms) / statistics.median(cold_ms)


@dataclass(slots=True)
class WorkloadResult:
    """One workload's run. hit_rate comes from the engine's own counters (tokens, at admission)."""

    name: str
    prompt_tokens: list[int]
    cached_tokens: list[int]
    hit_rate: float
    ttft_off_ms: list[float]
    ttft_on_ms: list[float]

    @property
    def p50_off_ms(self) -> float:
        return statistics.median(self.ttft_off_ms)

    @property
    def p50_on_ms(self) -> float:
        return statistics.median(self.ttft_on_ms)

    @property
    def reduction(self) -> float:
        return ttft_reduction(self.ttft_off_ms, self.ttft_on_ms)


def _counters(llm) -> tuple[int, int]:
    stats = llm.get_stats()
    return stats.prefix_cache_queries, stats.prefix_cache_hits


def measure(workload: Workload, llm_on, llm_off, max_tokens: int = 1) -> WorkloadResult:
    """Send the prompts one at a time to both engines, alternating, from an empty prefix cache.

    Alternating spreads the machine's load changes evenly over both sides; max_tokens=1 makes each
    request cost its prefill and one sample, which is what TTFT measures.
    """
    if llm_off.engine.kv_cache_manager.enable_caching or not llm_on.engine.kv_cache_manager.enable_caching:
        raise ValueError("measure() needs llm_on with prefix caching and llm_off without.")
    if not llm_on.reset_prefix_cache():
        raise RuntimeError("llm_on has requests in flight; its prefix cache cannot be reset.")
    params = SamplingParams(temperature=0, max_tokens=max_tokens)
    queries0, hits0 = _counters(llm_on)
    off, on = [], []
    for ids in workload.prompts:
        off.append(llm_off.generate(prompt_token_ids=list(ids), sampling_params=params)[0])
        on.append(llm_on.generate(prompt_token_ids=list(ids), sampling_params=params)[0])
    queries, hits = (now - before for now, before in zip(_counters(llm_on), (queries0, hits0)))
    return WorkloadResult(
        workload.name,
        [len(ids) for ids in workload.prompts],
        [o.num_cached_tokens for o in on],
        hits / queries,
        [1000 * o.ttft for o in off],
        [1000 * o.ttft for o in on],
    )


@dataclass(frozen=True, slots=True)
class SweepPoint:
    prefix_tokens: int
    prompt_tokens: int
    cached_tokens: int
    cold_ms: float  # cache on but empty: the first request with this prefix computes all of it
    warm_ms: float  # the same prefix, cached by the cold request, with another suffix
    off_ms: float | None = None  # the warm request's prompt on an engine without prefix caching


def prefix_sweep(
    tok, llm_on, llm_off=None, prefixes: Sequence[int] = (0, 64, 128, 256, 512), suffix_tokens: int = 32, seed: int = 0
) -> list[SweepPoint]:
    """TTFT of prompts made of a shared prefix and their own suffix, for each prefix length: the first
    request (cold), a second one with another suffix (warm) and, given llm_off, the second with caching off."""
    rng = random.Random(seed)
    params = SamplingParams(temperature=0, max_tokens=1)
    body = tok.encode(prose(tok, rng, max(prefixes)))
    points = []
    for n in prefixes:
        first, second = (tok.encode(prose(tok, rng, suffix_tokens))[:suffix_tokens] for _ in range(2))
        llm_on.reset_prefix_cache()
        (cold,) = llm_on.generate(prompt_token_ids=body[:n] + first, sampling_params=params)
        (warm,) = llm_on.generate(prompt_token_ids=body[:n] + second, sampling_params=params)
        off_ms = None
        if llm_off is not None:
            (off,) = llm_off.generate(prompt_token_ids=body[:n] + second, sampling_params=params)
            off_ms = 1000 * off.ttft
        points.append(
            SweepPoint(
                n, len(warm.prompt_token_ids), warm.num_cached_tokens, 1000 * cold.ttft, 1000 * warm.ttft, off_ms
            )
        )
    return points


def fit_cost_model(computed_tokens: Sequence[int], ttft_ms: Sequence[float]) -> tuple[float, float]:
    """TTFT ≈ fixed_ms + per_token_ms × (tokens actually prefilled), fitted by Theil-Sen: the slope is the
    median of the slopes between all pairs of points, the intercept the median residual. Unlike least
    squares, one request slowed down by another process on the machine cannot tilt the line."""
    points = list(zip(computed_tokens, ttft_ms))
    per_token = statistics.median(
        (y2 - y1) / (x2 - x1) for (x1, y1), (x2, y2) in itertools.combinations(points, 2) if x1 != x2
    )
    return statistics.median(y - per_token * x for x, y in points), per_token


def sweep_cost_model(points: Sequence[SweepPoint]) -> tuple[float, float]:
    """The cost model fitted to every request of a sweep: cold and warm (and off, when measured)."""
    measured = [(p.prompt_tokens, p.cold_ms) for p in points] + [
        (p.prompt_tokens, p.off_ms) for p in points if p.off_ms is not None
    ]
    measured += [(p.prompt_tokens - p.cached_tokens, p.warm_ms) for p in points]
    return fit_cost_model(*zip(*measured))


def predicted_reduction(result: WorkloadResult, fixed_ms: float, per_token_ms: float) -> float:
    """The TTFT reduction the cost model expects from the measured hits alone."""
    off = [fixed_ms + per_token_ms * n for n in result.prompt_tokens]
    on = [fixed_ms + per_token_ms * (n - c) for n, c in zip(result.prompt_tokens, result.cached_tokens)]
    return ttft_reduction(off, on)


# ---- stored runs and tables ----------------------------------------------------------------------
def save_run(path: Path, results: Sequence[WorkloadResult], points: Sequence[SweepPoint], extra: dict) -> None:
    model = sweep_cost_model(points)
    path.write_text(
        json.dumps(
            {
                **extra,
                "cost_model_ms": {"fixed": model[0], "per_token": model[1]},
                "results": [asdict(r) for r in results],
                "prefix_sweep": [asdict(p) for p in points],
            },
            indent=2,
        )
    )


def load_run(path: Path = STORED_RUN) -> tuple[list[WorkloadResult], list[SweepPoint], dict]:
    """A run written by save_run (bench/workloads.py): results, sweep, and the rest of the report."""
    report = json.loads(Path(path).read_text())
    results = [WorkloadResult(**r) for r in report.pop("results")]
    return results, [SweepPoint(**p) for p in report.pop("prefix_sweep")], report


def _pct_range(lo: float, hi: float) -> str:
    return f"{100 * lo:.0f}%" if lo == hi else f"{100 * lo:.0f}-{100 * hi:.0f}%"


def results_markdown(results: Sequence[WorkloadResult], model: tuple[float, float] | None = None) -> str:
    """The measured table beside the blog post's; with a cost model, also the reduction it predicts."""
    head = "| workload | hit rate | TTFT p50 off | on | reduction |" + (" predicted |" if model else "")
    head += " blog post: hit rate | reduction |"
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in results:
        post_hit, post_red = BLOG_POST_TABLE[r.name]
        row = f"| {r.name} | {100 * r.hit_rate:.0f}% | {r.p50_off_ms:.0f} ms | {r.p50_on_ms:.0f} ms | {100 * r.reduction:.0f}% |"
        if model:
            row += f" {100 * predicted_reduction(r, *model):.0f}% |"
        lines.append(row + f" {_pct_range(*post_hit)} | {_pct_range(*post_red)} |")
    return "\n".join(lines)


# ---- plots ---------------------------------------------------------------------------------------
def plot_prefix_sweep(points: Sequence[SweepPoint], model: tuple[float, float] | None = None):
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=80)
    xs = [p.prefix_tokens for p in points]
    if all(p.off_ms is not None for p in points):
        ax.plot(xs, [p.off_ms for p in points], "s-", color="#c44", label="cache off")
    ax.plot(xs, [p.cold_ms for p in points], "x--", color="#e90", label="cache on, first request (cold)")
    ax.plot(xs, [p.warm_ms for p in points], "o-", color="#4a4", label="cache on, prefix cached")
    if model:
        fixed, per_token = model
        ax.plot(xs, [fixed + per_token * p.prompt_tokens for p in points], ":", color="#888", label="cost model")
    ax.set_xlabel(f"shared prefix (tokens), + {points[0].prompt_tokens - points[0].prefix_tokens}-token suffix")
    ax.set_ylabel("TTFT (ms)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_workloads(results: Sequence[WorkloadResult]):
    """Our hit rate and TTFT reduction per workload, with the blog post's ranges as vertical bars."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=80)
    xs = range(len(results))
    ax.bar([x - 0.2 for x in xs], [100 * r.hit_rate for r in results], 0.4, color="#58a", label="hit rate (ours)")
    ax.bar([x + 0.2 for x in xs], [100 * r.reduction for r in results], 0.4, color="#4a4", label="TTFT p50 cut (ours)")
    for x, r in zip(xs, results):
        (hlo, hhi), (rlo, rhi) = BLOG_POST_TABLE[r.name]
        ax.plot([x - 0.2] * 2, [100 * hlo, 100 * hhi + 0.8], color="k", lw=3)
        ax.plot([x + 0.2] * 2, [100 * rlo, 100 * rhi + 0.8], color="k", lw=3)
    ax.plot([], [], color="k", lw=3, label="the blog post's range")
    ax.set_xticks(list(xs), [r.name for r in results], rotation=20, fontsize=8)
    ax.set_ylabel("%")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


# ---- the workload explorer -----------------------------------------------------------------------
_COLORS = {HIT: "#9be39b", RECOMPUTED: "#f2d675", NEW: "#f5b7a8", PARTIAL: "#ddd"}


def _rows_html(tok, workload: Workload, rows: Sequence[RequestBlocks], live: dict[int, int]) -> str:
    out = []
    for i, (ids, row) in enumerate(zip(workload.prompts, rows)):
        size = row.block_size
        cells = "".join(
            f'<td title="{html.escape(tok.decode(ids[b * size : (b + 1) * size]))}" '
            f'style="background:{_COLORS[s]};width:9px;height:14px;border:1px solid #888"></td>'
            for b, s in enumerate(row.blocks)
        )
        seen = f", engine: {live[i]}" if i in live else ""
        out.append(
            f"<tr><th style='text-align:left;padding-right:8px;font-weight:normal;white-space:nowrap'>"
            f"#{i}: {row.num_tokens} tok, {row.hit_tokens} cached{seen}</th>{cells}</tr>"
        )
    legend = " ".join(
        f'<span style="background:{c};padding:0 6px;border:1px solid #888">{s}</span>' for s, c in _COLORS.items()
    )
    return f"<table style='border-collapse:collapse'>{''.join(out)}</table><div>{legend}</div>"


class WorkloadExplorer:
    """Pick a workload; see every request's blocks as a row: green blocks come from the prefix cache,
    red ones are prefilled, amber ones are cached but recomputed (the last-token rule), grey is the
    partial last block. The rows are predicted by the engine's own KV cache manager; the summary shows
    the measurements passed in (no recomputing), and the button re-runs the first requests on the engine."""

    def __init__(
        self,
        tok,
        workloads: Sequence[Workload],
        results: Sequence[WorkloadResult] = (),
        llm=None,
        block_size: int = 16,
        live_requests: int = 3,
    ):
        self.tok, self.block_size, self.llm, self.live_requests = tok, block_size, llm, live_requests
        self.workloads = {w.name: w for w in workloads}
        self.results = {r.name: r for r in results}
        self.choice = widgets.Dropdown(options=[(w.title, w.name) for w in workloads], description="Workload")
        self.button = widgets.Button(
            description=f"Re-run first {live_requests} on the engine", disabled=llm is None, layout={"width": "auto"}
        )
        self.view, self.summary = widgets.HTML(), widgets.HTML()
        self.choice.observe(lambda _: self.refresh(), names="value")
        self.button.on_click(lambda _: self.remeasure())
        self.widget = widgets.VBox([widgets.HBox([self.choice, self.button]), self.view, self.summary])
        self.refresh()

    @property
    def workload(self) -> Workload:
        return self.workloads[self.choice.value]

    def refresh(self, live: dict[int, int] | None = None, live_ttft: Sequence[float] = ()) -> None:
        self.live = live or {}
        self.rows = block_rows(self.workload.prompts, self.block_size)
        self.predicted_hit_rate = sum(r.hit_tokens for r in self.rows) / sum(r.num_tokens for r in self.rows)
        self.view.value = _rows_html(self.tok, self.workload, self.rows, self.live)
        text = (
            f"<b>{html.escape(self.workload.title)}</b>: shares {html.escape(self.workload.shares)}. "
            f"Predicted hit rate {100 * self.predicted_hit_rate:.1f}%."
        )
        if (r := self.results.get(self.workload.name)) is not None:
            text += (
                f" Measured: hit rate {100 * r.hit_rate:.1f}%, TTFT p50 {r.p50_off_ms:.0f} ms off → "
                f"{r.p50_on_ms:.0f} ms on ({100 * r.reduction:.0f}% less)."
            )
        if live_ttft:
            text += " Re-run TTFTs: " + ", ".join(f"{t:.0f} ms" for t in live_ttft) + "."
        self.summary.value = text

    def remeasure(self) -> None:
        """Run the first requests on the engine from an empty cache; show its num_cached_tokens."""
        self.llm.reset_prefix_cache()
        params = SamplingParams(temperature=0, max_tokens=1)
        outs = [
            self.llm.generate(prompt_token_ids=list(p), sampling_params=params)[0]
            for p in self.workload.prompts[: self.live_requests]
        ]
        self.refresh({i: o.num_cached_tokens for i, o in enumerate(outs)}, [1000 * o.ttft for o in outs])

    def _ipython_display_(self) -> None:
        show_view(self)
