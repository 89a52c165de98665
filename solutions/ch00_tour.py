"""Chapter 00 solutions: warm-up with prompts, tokens and blocks."""

from __future__ import annotations

from collections.abc import Sequence

DEFAULT_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


def render_chatml(messages: list[dict]) -> str:
    """Task 00.1: render a conversation in SmolLM2's chat format (ChatML), ready for the reply."""
    if messages and messages[0]["role"] != "system":
        messages = [{"role": "system", "content": DEFAULT_SYSTEM}, *messages]
    turns = [f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages]
    return "".join(turns) + "<|im_start|>assistant\n"


def shared_prefix_blocks(ids_a: Sequence[int], ids_b: Sequence[int], block_size: int) -> int:
    """Task 00.2: how many leading full blocks two token sequences have in common."""
    count = 0
    for i in range(min(len(ids_a), len(ids_b)) // block_size):
        span = slice(i * block_size, (i + 1) * block_size)
        if list(ids_a[span]) != list(ids_b[span]):
            break
        count += 1
    return count


def expected_cached_tokens(prompt_len: int, shared_prefix_tokens: int, block_size: int) -> int:
    """Task 00.3: predict num_cached_tokens for a prompt with a cached shared prefix."""
    return min(shared_prefix_tokens // block_size, (prompt_len - 1) // block_size) * block_size
