"""Chapter 00 exercises: warm-up with prompts, tokens and blocks.

Check your work with:   make grade CH=00
"""

from __future__ import annotations

from collections.abc import Sequence

DEFAULT_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


def render_chatml(messages: list[dict]) -> str:
    """Task 00.1: render a conversation in SmolLM2's chat format (ChatML), ready for the reply.

    Each message becomes "<|im_start|>{role}\\n{content}<|im_end|>\\n"; the prompt ends with
    "<|im_start|>assistant\\n" so the model writes the assistant's turn. If the first message is not a
    system message, SmolLM2's template first inserts one with DEFAULT_SYSTEM as its content.

    Hints: build a list of strings and "".join() it; compare with llm.apply_chat_template(messages).
    """
    raise NotImplementedError


def shared_prefix_blocks(ids_a: Sequence[int], ids_b: Sequence[int], block_size: int) -> int:
    """Task 00.2: how many leading FULL blocks two token sequences have in common.

    Block i covers tokens [i*block_size, (i+1)*block_size). Count blocks from the start while both
    sequences have that block complete and identical; stop at the first difference.

    Hints: min(len(a), len(b)) // block_size bounds the count.
    """
    raise NotImplementedError


def expected_cached_tokens(prompt_len: int, shared_prefix_tokens: int, block_size: int) -> int:
    """Task 00.3: predict num_cached_tokens for a prompt whose first shared_prefix_tokens tokens are
    already in the prefix cache.

    Only whole blocks are reused, and a hit never covers the prompt's last token: that token must be
    computed to get the logits of the next one.

    Hints: whole shared blocks = shared_prefix_tokens // block_size; the cap is (prompt_len - 1) // block_size.
    """
    raise NotImplementedError
