"""What integration can break (chapter 10): each of your parts alone in nanoengine, on workloads that preempt
and ask for prompt logprobs, compared with nanoengine itself, so a difference names the part that made it.

The workloads run on a tiny random model (outputs that depend on the context, steps of milliseconds), so every
part gets its own engine and the whole comparison takes seconds.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from types import ModuleType

from nanoengine import LLM, SamplingParams
from nanoengine.config import LlamaConfig
from nanoengine.model import LlamaForCausalLM

from .grading import seeded_bugs
from .my_engine import PARTS, SOURCES, Part, my_parts, part_status


@dataclass(frozen=True, slots=True)
class Workload:
    name: str
    requests: tuple[tuple[tuple[int, ...], SamplingParams], ...]
    engine_args: dict  # the pool and budget that make it what it is


def _params(max_tokens: int, **kw) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True, **kw)


PREFIX = tuple(range(3, 27))  # 24 tokens: six full 4-token blocks every request shares
WORKLOADS = (
    Workload(
        "chatbot",
        tuple((PREFIX + (100 + i, 110 + i, 120 + i), _params(8)) for i in range(6)),
        {"block_size": 4, "num_gpu_blocks_override": 96},
    ),
    # Long prompts and outputs on a pool that holds three at a time: preemption, recompute, readmission hits.
    Workload(
        "preemption-heavy",
        tuple((PREFIX + tuple(range(100 + 20 * i, 112 + 20 * i)), _params(24)) for i in range(5)),
        {"block_size": 4, "num_gpu_blocks_override": 40, "max_num_batched_tokens": 32},
    ),
    # Every other request scores its prompt: it must read nothing from the cache, and still write its blocks.
    Workload(
        "prompt logprobs",
        tuple((PREFIX + (200 + i, 210 + i), _params(4, prompt_logprobs=1 if i % 2 else None)) for i in range(6)),
        {"block_size": 4, "num_gpu_blocks_override": 96},
    ),
)


@dataclass(frozen=True, slots=True)
class Served:
    """What an engine did with a workload, field by field as part_diff compares them."""

    tokens: tuple[tuple[int, ...], ...]
    hits: tuple[int, ...]  # num_cached_tokens per request, at its first admission
    prompt_logprobs: tuple  # each asked-for prompt token's logprob, rounded; None for a plain request
    finish_order: tuple[int, ...]  # the requests by the step they finished in
    steps: int
    prefill_tokens: int  # prompt tokens computed, recomputation after preemption included
    peak_blocks: int
    preemptions: int


def tiny_model() -> LlamaForCausalLM:
    return LlamaForCausalLM.random(LlamaConfig.tiny(), seed=0, std=0.2)


def serve(llm: LLM, workload: Workload) -> Served:
    """Run the workload to the end, one engine step at a time, watching the pool's high-water mark."""
    engine = llm.engine
    pool = engine.kv_cache_manager.block_pool
    ids = [engine.add_request(list(tokens), params) for tokens, params in workload.requests]
    done, peak = {}, 0
    while engine.has_unfinished_requests():
        done.update((out.request_id, out) for out in engine.step())
        peak = max(peak, pool.num_gpu_blocks - 1 - pool.get_num_free_blocks())
    outs, stats = [done[i] for i in ids], llm.get_stats()
    logprobs = tuple(
        None
        if o.prompt_logprobs is None
        else tuple(None if e is None else round(e[t].logprob, 4) for t, e in zip(o.prompt_token_ids, o.prompt_logprobs))
        for o in outs
    )
    return Served(
        tuple(tuple(o.token_ids) for o in outs),
        tuple(o.num_cached_tokens for o in outs),
        logprobs,
        tuple(ids.index(i) for i in done),
        stats.num_steps,
        stats.num_prefill_tokens,
        peak,
        stats.num_preemptions,
    )


def differences(yours: Served, reference: Served) -> list[str]:
    """The fields that differ, in words."""
    return [
        f.name.replace("_", " ")
        for f in dataclasses.fields(Served)
        if getattr(yours, f.name) != getattr(reference, f.name)
    ]


def engines_per_part(source: str = "exercises") -> dict[str, dict]:
    """For each part that would serve in my_llm(source=...): the LLM arguments that plug in that part alone."""
    statuses = [part_status(p, source) for p in PARTS]
    return {f"{s.part.chapter} {s.part.title}": my_parts([s], source) for s in statuses if s.used}


def with_mistake(part: Part, mistake: str) -> dict:
    """The LLM arguments of the worked solution's part with one of its chapter's seeded bugs applied (the text of
    a mistake in nanocourse/bugs/)."""
    _, _, old, new = next(b for b in seeded_bugs(part.module) if b[1] == mistake)
    source = (SOURCES["solutions"] / f"{part.module}.py").read_text()
    module = ModuleType(f"mistake_{part.module}")
    code = compile(source.replace(old, new, 1), f"{part.module}.py (with: {mistake})", "exec")
    exec(code, module.__dict__)  # noqa: S102 -- the course's own worked solution with one seeded bug
    # A part whose classes go in together (chapter 06's KVCacheManager and FullAttentionManager) brings them all.
    return {
        part.argument: getattr(module, part.name),
        **{argument: getattr(module, name) for name, argument in part.also},
    }


def part_diff(engines: dict[str, dict], model: LlamaForCausalLM | None = None) -> str:
    """A table: for each engine (a part alone, the rest nanoengine's) and workload, what differs from nanoengine."""
    model = model or tiny_model()
    reference = {w.name: serve(LLM(model, progress=False, **w.engine_args), w) for w in WORKLOADS}
    if not engines:
        return "no part serves yet: every seam is nanoengine's, so there is nothing to compare"
    lines = []
    for name, parts in engines.items():
        lines.append(name)
        for w in WORKLOADS:
            try:
                diff = differences(serve(LLM(model, progress=False, **w.engine_args, **parts), w), reference[w.name])
                text = "; ".join(diff) + " differ" if diff else "same as nanoengine"
            except Exception as error:  # noqa: BLE001 -- the engine refusing what a part did is a difference too
                text = f"the engine raised {type(error).__name__}"
            lines.append(f"  {w.name + ':':18} {text}")
    return "\n".join(lines)
