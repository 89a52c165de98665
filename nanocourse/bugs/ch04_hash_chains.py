"""Seeded bugs for chapter 04: the worked solution with one mistake a learner could make."""

BUGS = [
    # (task id that must fail, the mistake, text found exactly once in solutions/ch04_hash_chains.py, its replacement)
    ("04.1", "token order ignored", "len(token_ids), *token_ids)", "len(token_ids), *sorted(token_ids))"),
    ("04.1", "a 64-bit hash", "    return xxhash.xxh3_128_digest(data)", "    return xxhash.xxh3_64_digest(data)"),
    (
        "04.1b",
        "the parent is ignored: no chain",
        "    data = ROOT_HASH if parent_block_hash is None else parent_block_hash",
        "    data = ROOT_HASH",
    ),
    (
        "04.1",
        "an empty root: None is not hashed as ROOT_HASH",
        "data = ROOT_HASH if parent_block_hash is None else parent_block_hash",
        'data = parent_block_hash or b""',
    ),
    (
        "04.1",
        "the ids encoded through repr: a list and a tuple of the same ids differ",
        'data += struct.pack(f"<I{len(token_ids)}I", len(token_ids), *token_ids)',
        "data += repr(token_ids).encode()",
    ),
    (
        "04.1",
        "the extra keys encoded through Python's hash(): it changes with PYTHONHASHSEED",
        "encoded = str(key).encode()",
        "encoded = str(hash(key)).encode()",
    ),
    ("04.1b", "extra keys ignored", "    for key in extra_keys or ():\n", "    for key in ():\n"),
    (
        "04.2",
        "the partial last block is hashed too",
        "range(0, len(token_ids) - block_size + 1, block_size)",
        "range(0, len(token_ids), block_size)",
    ),
    (
        "04.2",
        "each block hashed alone, not chained",
        "parent = hash_block_tokens(parent, token_ids[start",
        "parent = hash_block_tokens(None, token_ids[start",
    ),
    ("04.2b", "the salt ignored", "keys = (cache_salt,) if cache_salt and start == 0 else None", "keys = None"),
    (
        "04.2b",
        "the salt on the second block",
        "keys = (cache_salt,) if cache_salt and start == 0 else None",
        "keys = (cache_salt,) if cache_salt and start == block_size else None",
    ),
    (
        "04.3",
        "no num_tokens - 1 rule",
        "block_hashes[: max(num_tokens - 1, 0) // block_size]",
        "block_hashes[: num_tokens // block_size]",
    ),
    (
        "04.3",
        "num_tokens=0 slices to the last hash: block_hashes[:-1]",
        "block_hashes[: max(num_tokens - 1, 0) // block_size]",
        "block_hashes[: (num_tokens - 1) // block_size]",
    ),
    (
        "04.3",
        "a miss is skipped, not the end of the walk",
        "            break\n        hits += 1",
        "            continue\n        hits += 1",
    ),
    (
        "04.5",
        "token ids joined as decimal text: [1, 23] and [12, 3] collide",
        'data += struct.pack(f"<I{len(token_ids)}I", len(token_ids), *token_ids)',
        'data += "".join(map(str, token_ids)).encode()',
    ),
    (
        "04.5",
        "16-bit ids: 5 and 65541 collide",
        'data += struct.pack(f"<I{len(token_ids)}I", len(token_ids), *token_ids)',
        'data += struct.pack(f"<H{len(token_ids)}H", len(token_ids), *[t & 0xFFFF for t in token_ids])',
    ),
    (
        "04.2b",
        "the salt on every block",
        "keys = (cache_salt,) if cache_salt and start == 0 else None",
        "keys = (cache_salt,) if cache_salt else None",
    ),
    (
        "04.5",
        "the salt on every block",
        "keys = (cache_salt,) if cache_salt and start == 0 else None",
        "keys = (cache_salt,) if cache_salt else None",
    ),
    (
        "04.5",
        "extra keys joined with NUL: ('a\\x00b',) and ('a', 'b') collide",
        '    for key in extra_keys or ():\n        encoded = str(key).encode()\n        data += struct.pack("<I", len(encoded)) + encoded\n',
        '    if extra_keys:\n        data += "\\x00".join(map(str, extra_keys)).encode()\n',
    ),
    (
        "04.5",
        "no id count: the ids run into the keys",
        'data += struct.pack(f"<I{len(token_ids)}I", len(token_ids), *token_ids)',
        'data += struct.pack(f"<{len(token_ids)}I", *token_ids)',
    ),
    (
        "04.4",
        "a text hash, not bytes",
        "    return xxhash.xxh3_128_digest(data)",
        "    return xxhash.xxh3_128_hexdigest(data)",
    ),
    (
        "04.4",
        "hashes the list object's identity, not its tokens",
        'data += struct.pack(f"<I{len(token_ids)}I", len(token_ids), *token_ids)',
        "data += str(id(token_ids)).encode()",
    ),
]
