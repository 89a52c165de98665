"""Benchmark datasets: the chat conversation and the six prefix-caching workloads, as token ids.

Like vLLM's vllm/benchmarks/datasets.py, this module holds only data and the generators that turn it into
prompts; measuring lives in prefix_caching.py beside it and in bench/. The generators are deterministic: text
comes from fixed word lists and templates driven by a seeded random.Random, so the same seed gives the same
tokens on every machine. Each generator takes a tokenizer with encode() and apply_chat_template().
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

# A support chatbot's conversation: a long fixed system prompt and 16 short user turns (bench/engine.py serves
# it; the chatbot and multi-turn workloads below reuse it).
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


# Sizes per workload at each scale: "small" runs all six in under a minute on 2 CPU cores; "bench" is closer to
# the blog post's prompt lengths (the prefix-caching table in BLOG_POST_TABLE of nanoengine.benchmarks.prefix_caching).
SCALES = ("small", "bench")
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
    """Each workload's generator arguments at one of the SCALES."""
    if scale not in SCALES:
        raise ValueError(f"scale {scale!r} is not one of {SCALES}")
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


def chat_prompts(tok, n: int = len(USER_TURNS)) -> list[list[int]]:
    """The benchmark's chat requests as token ids: the whole SYSTEM_PROMPT, then each of the first n USER_TURNS, in
    the model's chat template."""
    return [list(_chat(tok, SYSTEM_PROMPT, u)) for u in USER_TURNS[:n]]


# ---- the six workloads ----------------------------------------------------------------------------
# Each generator takes the tokenizer, the number of requests n (at most 16, the benchmark's questions where
# it uses them), sizes in tokens, and a seed (unused where nothing is drawn). Defaults: the "small" scale.
def chatbot(tok, n: int = 5, system_tokens: int = 128, seed: int = 0) -> Workload:
    """One fixed system prompt (the benchmark's, cut to whole lines), a different short question each."""
    system = _head(SYSTEM_PROMPT, tok, system_tokens)
    return Workload(
        "chatbot",
        "Chatbot, fixed system prompt",
        "the whole system prompt",
        tuple(_chat(tok, system, u) for u in USER_TURNS[:n]),
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


def make_workloads(tok, scale: str = "small", seed: int = 0) -> list[Workload]:
    """The six workloads at one of the SCALES, in the blog post's table order."""
    return [GENERATORS[name](tok, seed=seed, **kwargs) for name, kwargs in sizes(scale).items()]
