"""EAGLE speculative decoding (speculative_config={"method": "eagle", "model": EagleLlamaForCausalLM}).

No trained EAGLE head exists for the course's models, so a random head drafts, and its drafts are checked
against a reference rather than against acceptance: after every step, each request's drafts must be the ones
the head gives when run from scratch on one contiguous cache over the request's tokens (the target's hidden
state at each position with the token after it, then its own drafts). A slot of the head's paged KV that missed
a position, or holds the KV of another next token, changes them. That is what the prefix-hit block drop
(use_eagle) is for: the test shows drafts go wrong without it. Greedy outputs equal speculation off throughout.
"""

from __future__ import annotations

import pytest
import torch

from nanoengine import LLM, SamplingParams
from nanoengine.attention.contiguous import ContiguousKVCache
from nanoengine.config import LlamaConfig
from nanoengine.core import FullAttentionManager
from nanoengine.errors import InvalidEngineArgumentError
from nanoengine.model import LlamaForCausalLM
from nanoengine.model.llama_eagle import EagleLlamaForCausalLM

TARGET = LlamaForCausalLM.random(LlamaConfig.tiny(tie_word_embeddings=False), seed=0, std=0.2)
HEAD = EagleLlamaForCausalLM.random(TARGET, seed=3, std=0.2)
K, BS = 3, 4
PROMPTS = [[(7 * i + 3 * j) % 256 for j in range(n)] for i, n in enumerate((5, 17, 40, 3, 23))]
# The same prompts up to a block boundary, then other tokens: a prefix hit ends where the head's KV at the
# hit's last position was built with another next token.
FORKS = [p[: len(p) // BS * BS] + [(t + 101) % 256 for t in p[len(p) // BS * BS :]] + [9, 8] for p in PROMPTS]
GREEDY = SamplingParams(temperature=0, max_tokens=20)
SPEC = {"method": "eagle", "model": HEAD, "num_speculative_tokens": K}


def tiny_llm(speculative_config=SPEC, **kwargs) -> LLM:
    args = {"block_size": BS, "num_gpu_blocks_override": 96, "progress": False}
    return LLM(TARGET, speculative_config=speculative_config, **(args | kwargs))


def token_ids(outputs) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in outputs]


@torch.inference_mode()
def reference_drafts(tokens: list[int], num: int) -> list[int]:
    """The head's drafts after tokens (the last one just sampled), from scratch on contiguous caches."""
    n = len(tokens)
    cache = ContiguousKVCache(TARGET.config, n)
    hidden = TARGET(torch.tensor(tokens[:-1]), torch.arange(n - 1), cache)
    head_cache = ContiguousKVCache(HEAD.config, n + num)
    out = HEAD(torch.tensor(tokens[1:]), torch.arange(n - 1), hidden, head_cache)
    head_cache.advance(n - 1)
    drafts, last = [], out[-1:]
    for j in range(num):
        drafts.append(int(HEAD.compute_logits(last).argmax(dim=-1)))
        if j + 1 < num:
            last = HEAD(torch.tensor(drafts[-1:]), torch.tensor([n - 1 + j]), last, head_cache)
            head_cache.advance(1)
    return drafts


def record_drafts(llm: LLM, monkeypatch) -> list[tuple[list[int], list[int]]]:
    """Every (the request's tokens, its drafts) the runner hands the engine, from now on."""
    runner, seen = llm.engine.runner, []
    take = runner.take_draft_token_ids

    def spy():
        drafts = take()
        seen.extend((list(runner.requests[r].token_ids), d) for r, d in drafts.items())
        return drafts

    monkeypatch.setattr(runner, "take_draft_token_ids", spy)
    return seen


def mismatches(seen) -> list[tuple[list[int], list[int], list[int]]]:
    return [
        (tokens, drafts, want) for tokens, drafts in seen if drafts != (want := reference_drafts(tokens, len(drafts)))
    ]


SETTINGS = {
    "plain": {},
    "chunked": {"max_num_batched_tokens": 8},
    "preempted": {"num_gpu_blocks_override": 30},
    "short": {"max_model_len": 48},
}


@pytest.fixture(scope="module")
def plain():
    return {
        name: token_ids(tiny_llm(None, **kwargs).generate(prompt_token_ids=PROMPTS + FORKS, sampling_params=GREEDY))
        for name, kwargs in SETTINGS.items()
    }


@pytest.mark.parametrize("name", SETTINGS)
def test_every_draft_is_the_heads_from_scratch_and_greedy_tokens_stay(plain, name, monkeypatch):
    llm = tiny_llm(**SETTINGS[name])
    seen = record_drafts(llm, monkeypatch)
    first = token_ids(llm.generate(prompt_token_ids=PROMPTS, sampling_params=GREEDY))
    forks = llm.generate(prompt_token_ids=FORKS, sampling_params=GREEDY)
    assert first + token_ids(forks) == plain[name], f"{name}: greedy tokens differ from speculation off"
    again = llm.generate(prompt_token_ids=PROMPTS, sampling_params=GREEDY)  # hits cut by the last-token rule
    assert token_ids(again) == first
    if name != "preempted":
        assert [o.num_cached_tokens for o in forks] == [max(len(p) // BS - 1, 0) * BS for p in PROMPTS], (
            "each fork hits its prompt's full blocks but the last, which EAGLE drops"
        )
    assert len(seen) > 50 and sum(map(len, (d for _, d in seen))) > 100
    wrong = mismatches(seen)
    assert not wrong, f"{name}: {len(wrong)} of {len(seen)} draft lists differ from the head's own, e.g. {wrong[0]}"
    stats = llm.get_stats()
    assert stats.num_preemptions > 0 if name == "preempted" else True
    assert llm.engine.kv_cache_manager.block_pool.get_num_free_blocks() == llm.kv_cache.num_blocks - 1


def test_without_the_block_drop_drafts_after_a_hit_go_wrong(monkeypatch):
    llm = tiny_llm()
    llm.generate(prompt_token_ids=PROMPTS, sampling_params=GREEDY)
    coordinator = llm.engine.kv_cache_manager.coordinator
    monkeypatch.setattr(coordinator, "use_eagle", False)
    for manager in coordinator.single_type_managers:
        monkeypatch.setattr(manager, "use_eagle", False)
    seen = record_drafts(llm, monkeypatch)
    forks = llm.generate(prompt_token_ids=FORKS, sampling_params=GREEDY)
    assert [o.num_cached_tokens for o in forks] == [len(p) // BS * BS for p in PROMPTS]
    assert mismatches(seen), "the head's KV at each hit's last position was built with another next token"


def test_eagle_reaches_the_kv_manager_the_scheduler_and_the_runner():
    llm = tiny_llm()
    assert llm.engine.kv_cache_manager.coordinator.use_eagle
    # The head's layer joins the target's one group, which EngineConfig flags (vLLM's is_eagle_group).
    assert [g.is_eagle_group for g in llm.kv_cache_groups] == [True]
    assert llm.engine.scheduler.config.num_lookahead_tokens == K
    assert llm.draft_model is HEAD and llm.engine.runner.cuda_graphs is None
    assert not tiny_llm(
        {"method": "draft_model", "model": TARGET, "num_speculative_tokens": K}
    ).engine.kv_cache_manager.coordinator.use_eagle, "a draft model's KV needs no drop"
    assert not any(g.is_eagle_group for g in tiny_llm(None).kv_cache_groups)


def test_a_full_attention_manager_of_ones_own_is_refused_beside_eagle():
    class MyManager(FullAttentionManager):
        def find_longest_cache_hit(self, block_hashes, max_length, group_ids, token_ids=None):
            return super().find_longest_cache_hit(block_hashes, max_length, group_ids, token_ids)

    with pytest.raises(InvalidEngineArgumentError, match="drop the last hit block") as info:
        tiny_llm(full_attention_manager_cls=MyManager)
    assert info.value.parameter == "full_attention_manager_cls"


@pytest.mark.parametrize(
    "model, words",
    [
        (None, 'needs "model"'),
        (TARGET, "EagleLlamaForCausalLM built on this LLM's model"),
        (
            EagleLlamaForCausalLM.random(LlamaForCausalLM.random(LlamaConfig.tiny(), seed=5)),
            "built on this LLM's model",
        ),
        ("/some/eagle/head", "reads no EAGLE checkpoint"),
    ],
)
def test_a_bad_head_is_refused_by_name(model, words):
    with pytest.raises(InvalidEngineArgumentError, match=words) as info:
        tiny_llm({"method": "eagle", "model": model, "num_speculative_tokens": 2})
    assert info.value.parameter == "speculative_config"
