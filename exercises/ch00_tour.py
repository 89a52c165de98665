"""Chapter 00 exercises: warm-up with prompts, tokens and blocks.

Check your work with:   make grade CH=00
Stuck? In the notebook, `from nanocourse import hint; hint("00")` lists this chapter's hints, from a nudge to
close-to-code; open them one at a time with hint("00", n).
"""

from __future__ import annotations

from collections.abc import Sequence

DEFAULT_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


def render_chatml(messages: list[dict]) -> str:
    """Task 00.1: render a conversation in SmolLM2's chat format (ChatML), ready for the reply.

    Contract: `messages` is a list of {"role": ..., "content": ...} dicts (any role string, any content
    string). The result is exactly the text SmolLM2's own chat template renders with add_generation_prompt
    on, `llm.tokenizer.apply_chat_template(messages)` (llm.apply_chat_template gives the same, but refuses []):
    - every message, in order, becomes one turn "<|im_start|>{role}\\n{content}<|im_end|>\\n", the role and
      content copied as they are (no whitespace trimmed or added);
    - when the first message is not a system message, one system turn whose content is DEFAULT_SYSTEM comes
      before it; a conversation that opens with a system message gets none, even if others follow, and a
      system message later in the conversation is just another turn;
    - the text ends with "<|im_start|>assistant\\n", the opening of the turn the model writes; an empty
      conversation renders as that opening alone.
    The caller's list and dicts are left as they were.
    (vLLM 0.33: LLM.chat in vllm/entrypoints/llm.py, add_generation_prompt=True by default, renders with the
    model's own template: HfRenderer.render_messages calls safe_apply_chat_template, vllm/renderers/hf.py.)
    Example: render_chatml([{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Hi"}])
    == "<|im_start|>system\\nBe terse.<|im_end|>\\n<|im_start|>user\\nHi<|im_end|>\\n<|im_start|>assistant\\n";
    with only the user message, the first turn is "<|im_start|>system\\n" + DEFAULT_SYSTEM + "<|im_end|>\\n".
    """
    raise NotImplementedError


def shared_prefix_blocks(ids_a: Sequence[int], ids_b: Sequence[int], block_size: int) -> int:
    """Task 00.2: how many leading FULL blocks two token sequences have in common.

    Contract: block i covers tokens [i*block_size, (i+1)*block_size). Returns the number of blocks, from
    block 0 on, that both sequences hold complete and whose tokens are identical; the count stops at the first
    block that differs, even if later blocks are equal again. A partial last block never counts, and only the
    token values matter: a list and a tuple of the same ids share their blocks. An empty sequence shares 0.
    This is the number of blocks the prefix cache could reuse between the two prompts.
    (vLLM 0.33: FullAttentionManager.find_longest_cache_hit in vllm/v1/core/single_type_kv_cache_manager.py
    walks the request's block hashes from the start and stops at the first miss; only full blocks get a hash,
    see get_request_block_hasher and hash_block_tokens in vllm/v1/core/kv_cache_utils.py.)
    Example: with a = list(range(50)), shared_prefix_blocks(a, a[:40] + [0] * 10, 16) == 2 (they part at
    token 40, inside block 2), and shared_prefix_blocks(a, a, 16) == 3 (tokens 48, 49 are a partial block).
    """
    raise NotImplementedError


def expected_cached_tokens(prompt_len: int, shared_prefix_tokens: int, block_size: int) -> int:
    """Task 00.3: predict num_cached_tokens for a prompt whose first shared_prefix_tokens tokens are
    already in the prefix cache.

    Contract: 1 <= prompt_len and 0 <= shared_prefix_tokens <= prompt_len. Returns the number of prompt
    tokens the engine takes from the cache, which is what its KVCacheManager.get_computed_blocks reports:
    - only whole blocks are reused, so the result is a multiple of block_size and at most the shared tokens;
    - a hit never covers the prompt's last token: its output is what predicts the next token, so it must be
      computed, and with it the whole block it sits in;
    - within those two limits, every shared whole block is reused.
    (vLLM 0.33: KVCacheManager.get_computed_blocks in vllm/v1/core/kv_cache_manager.py sets
    max_cache_hit_length to request.num_tokens - 1 and keeps the hit block-aligned.)
    Example: the notebook's repeat of a 607-token prompt, expected_cached_tokens(607, 607, 16) == 592 (37
    blocks); a 608-token prompt repeated also reuses 592, not 608; expected_cached_tokens(607, 582, 16) == 576.
    """
    raise NotImplementedError
