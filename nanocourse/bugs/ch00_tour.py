"""Seeded bugs for chapter 00: the worked solution with one mistake a learner could make."""

BUGS = [
    # (task id that must fail, the mistake, text found exactly once in solutions/ch00_tour.py, its replacement)
    ("00.1", "no default system prompt", 'if messages and messages[0]["role"] != "system":', "if False:"),
    (
        "00.1",
        "no opening for the assistant's reply",
        'return "".join(turns) + "<|im_start|>assistant\\n"',
        'return "".join(turns)',
    ),
    ("00.1", "no newline after a turn", '<|im_end|>\\n" for m in messages]', '<|im_end|>" for m in messages]'),
    (
        "00.1",
        "the default system message inserted even when the conversation starts with one",
        'if messages and messages[0]["role"] != "system":',
        "if messages:",
    ),
    (
        "00.1",
        "the default system message skipped when any message, not the first, is a system one",
        'messages[0]["role"] != "system"',
        'all(m["role"] != "system" for m in messages)',
    ),
    (
        "00.1",
        "an empty conversation still gets the default system message",
        'if messages and messages[0]["role"] != "system":',
        'if not messages or messages[0]["role"] != "system":',
    ),
    (
        "00.1",
        "the contents stripped of surrounding whitespace",
        "\\n{m['content']}<|im_end|>",
        "\\n{m['content'].strip()}<|im_end|>",
    ),
    (
        "00.1",
        "the caller's list changed: the default system message inserted into it",
        'messages = [{"role": "system", "content": DEFAULT_SYSTEM}, *messages]',
        'messages.insert(0, {"role": "system", "content": DEFAULT_SYSTEM})',
    ),
    (
        "00.2",
        "a partial last block counts",
        "for i in range(min(len(ids_a), len(ids_b)) // block_size):",
        "for i in range(-(-min(len(ids_a), len(ids_b)) // block_size)):",
    ),
    (
        "00.2",
        "a mismatch is skipped, not the end",
        "            break\n        count += 1",
        "            continue\n        count += 1",
    ),
    (
        "00.2",
        "slices compared as they come, so a list never equals a tuple of the same tokens",
        "if list(ids_a[span]) != list(ids_b[span]):",
        "if ids_a[span] != ids_b[span]:",
    ),
    ("00.3", "no last-token rule", "(prompt_len - 1) // block_size", "prompt_len // block_size"),
    (
        "00.3",
        "the shared prefix rounded up to blocks",
        "min(shared_prefix_tokens // block_size,",
        "min(-(-shared_prefix_tokens // block_size),",
    ),
    (
        "00.3",
        "a wholly shared prompt gives up a block even when its last block is partial, never cached",
        "(prompt_len - 1) // block_size",
        "prompt_len // block_size - (shared_prefix_tokens >= prompt_len)",
    ),
]
