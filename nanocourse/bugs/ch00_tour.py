"""Seeded bugs for chapter 00: the worked solution with one mistake a learner could make."""

BUGS = [
    # (task id that must fail, the mistake, text found exactly once in solutions/ch00_tour.py, its replacement)
    ("00.1", "no default system prompt", 'if not messages or messages[0]["role"] != "system":', "if False:"),
    ("00.1", "no opening for the assistant's reply", 'return "".join(turns) + "<|im_start|>assistant\\n"',
     'return "".join(turns)'),
    ("00.1", "no newline after a turn", "<|im_end|>\\n\" for m in messages]", "<|im_end|>\" for m in messages]"),
    ("00.2", "a partial last block counts", "for i in range(min(len(ids_a), len(ids_b)) // block_size):",
     "for i in range(-(-min(len(ids_a), len(ids_b)) // block_size)):"),
    ("00.2", "a mismatch is skipped, not the end", "            break\n        count += 1", "            continue\n        count += 1"),
    ("00.3", "no last-token rule", "(prompt_len - 1) // block_size", "prompt_len // block_size"),
    ("00.3", "the shared prefix rounded up to blocks", "min(shared_prefix_tokens // block_size,",
     "min(-(-shared_prefix_tokens // block_size),"),
]
