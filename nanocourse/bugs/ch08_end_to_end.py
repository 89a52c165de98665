"""Seeded bugs for chapter 08: the worked solution with one mistake a learner could make."""

BUGS = [
    # (task id that must fail, the mistake, text found exactly once in solutions/ch08_end_to_end.py, its replacement)
    (
        "08.1",
        "the mean of per-request ratios",
        "return sum(o.num_cached_tokens for o in outputs) / queries if queries else 0.0",
        "return sum(o.num_cached_tokens / len(o.prompt_token_ids) for o in outputs) / len(outputs) if outputs else 0.0",
    ),
    (
        "08.1",
        "no outputs divides by zero",
        "return sum(o.num_cached_tokens for o in outputs) / queries if queries else 0.0",
        "return sum(o.num_cached_tokens for o in outputs) / queries",
    ),
    (
        "08.1b",
        "output tokens counted as queries",
        "queries = sum(len(o.prompt_token_ids) for o in outputs)",
        "queries = sum(len(o.prompt_token_ids) + len(o.token_ids) for o in outputs)",
    ),
    (
        "08.1b",
        "the mean of per-request ratios",
        "return sum(o.num_cached_tokens for o in outputs) / queries if queries else 0.0",
        "return sum(o.num_cached_tokens / len(o.prompt_token_ids) for o in outputs) / len(outputs) if outputs else 0.0",
    ),
    (
        "08.2",
        "an even count takes the upper middle value",
        "return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2",
        "return ordered[mid]",
    ),
    ("08.2", "sorts the caller's list", "    ordered = sorted(values)\n", "    values.sort()\n    ordered = values\n"),
    (
        "08.2",
        "the reduction's ratio upside down",
        "return 1 - p50(warm_ms) / p50(cold_ms)",
        "return 1 - p50(cold_ms) / p50(warm_ms)",
    ),
    ("08.2", "equal times counted once", "    ordered = sorted(values)\n", "    ordered = sorted(set(values))\n"),
    (
        "08.3",
        "the assistant's replies left out",
        'messages += [{"role": "user", "content": user_turns[j]}, {"role": "assistant", "content": replies[j]}]',
        'messages += [{"role": "user", "content": user_turns[j]}]',
    ),
    (
        "08.3",
        "no system message",
        '        messages = [{"role": "system", "content": system}]\n',
        "        messages = []\n",
    ),
    (
        "08.3",
        "one turn more than there are replies",
        "    for k, user in enumerate(user_turns):\n",
        "    for k in range(len(replies) + 1):\n        user = user_turns[k]\n",
    ),
    (
        "08.3b",
        "the replies sent as user turns",
        '{"role": "assistant", "content": replies[j]}]',
        '{"role": "user", "content": replies[j]}]',
    ),
    (
        "08.3b",
        "each turn sends only the newest question",
        "        for j in range(k):\n",
        "        for j in range(0):\n",
    ),
    (
        "08.4",
        "no num_tokens - 1 rule",
        "for h in hashes[: (len(ids) - 1) // block_size]:",
        "for h in hashes[: len(ids) // block_size]:",
    ),
    (
        "08.4",
        "only the previous prompt is remembered",
        "        cached.update(hashes)\n",
        "        cached = set(hashes)\n",
    ),
    (
        "08.4",
        "a block named by its own tokens, not by the chain through every token before it",
        '        hashes = Request("r", list(ids), block_hasher=hasher).block_hashes\n',
        "        hashes = [tuple(ids[i:i + block_size]) for i in range(0, len(ids) - block_size + 1, block_size)]\n",
    ),
    (
        "08.4b",
        "hits counted in blocks, not tokens",
        "        hits.append(n * block_size)\n",
        "        hits.append(n)\n",
    ),
    (
        "08.4b",
        "a prompt counted as cached before its own lookup",
        '        hashes = Request("r", list(ids), block_hasher=hasher).block_hashes\n',
        '        hashes = Request("r", list(ids), block_hasher=hasher).block_hashes\n        cached.update(hashes)\n',
    ),
]
