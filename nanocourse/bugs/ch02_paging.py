"""Seeded bugs for chapter 02: the worked solution with one mistake a learner could make."""

BUGS = [
    # (task id that must fail, the mistake, text found exactly once in solutions/ch02_paging.py, its replacement)
    (
        "02.1",
        "floor instead of ceiling: a partial block costs nothing",
        "return -(-num_tokens // block_size)",
        "return num_tokens // block_size",
    ),
    ("02.1", "always one block more", "return -(-num_tokens // block_size)", "return num_tokens // block_size + 1"),
    (
        "02.2",
        "the block id is used as the slot of its first token, offset ignored",
        "block_table[p // block_size] * block_size + p % block_size for p in range(start_pos, start_pos + num_tokens)",
        "block_table[p // block_size] * block_size for p in range(start_pos, start_pos + num_tokens)",
    ),
    (
        "02.2",
        "every chunk starts at position 0",
        "for p in range(start_pos, start_pos + num_tokens)",
        "for p in range(num_tokens)",
    ),
    (
        "02.2b",
        "the block table is ignored: pages assumed contiguous from block 0",
        "block_table[p // block_size] * block_size + p % block_size for p in range(start_pos, start_pos + num_tokens)",
        "p for p in range(start_pos, start_pos + num_tokens)",
    ),
    (
        "02.2b",
        "off by one position",
        "for p in range(start_pos, start_pos + num_tokens)",
        "for p in range(start_pos + 1, start_pos + num_tokens + 1)",
    ),
    (
        "02.3",
        "reads the whole table, padding included, without cutting at seq_len",
        "return cache[blocks].flatten(0, 1)[:seq_len]",
        "return cache[block_table.long()].flatten(0, 1)",
    ),
    (
        "02.3",
        "blocks in sorted order, not table order",
        "blocks = block_table[: num_blocks_needed(seq_len, cache.shape[1])].long()",
        "blocks = block_table[: num_blocks_needed(seq_len, cache.shape[1])].long().sort().values",
    ),
    (
        "02.3",
        "the result cast to float32 whatever the cache's dtype",
        "return cache[blocks].flatten(0, 1)[:seq_len]",
        "return cache[blocks].flatten(0, 1)[:seq_len].float()",
    ),
    (
        "02.3",
        "the whole table read, entries past the needed ones included",
        "blocks = block_table[: num_blocks_needed(seq_len, cache.shape[1])].long()",
        "blocks = block_table.long()",
    ),
    (
        "02.3b",
        "one block short: a floor for the number of blocks",
        "blocks = block_table[: num_blocks_needed(seq_len, cache.shape[1])].long()",
        "blocks = block_table[: seq_len // cache.shape[1]].long()",
    ),
    (
        "02.3b",
        "the first token dropped",
        "return cache[blocks].flatten(0, 1)[:seq_len]",
        "return cache[blocks].flatten(0, 1)[1 : seq_len + 1]",
    ),
    (
        "02.4",
        "counts whole empty blocks, not the empty tail",
        "return sum(num_blocks_needed(n, block_size) * block_size - n for n in seq_lens)",
        "return sum(num_blocks_needed(n, block_size) - n // block_size for n in seq_lens)",
    ),
    (
        "02.4",
        "a full last block counted as wasted",
        "return sum(num_blocks_needed(n, block_size) * block_size - n for n in seq_lens)",
        "return sum(block_size - n % block_size for n in seq_lens)",
    ),
    (
        "02.5",
        "append_row replaces the row",
        "        self.rows[req_id].extend(block_ids)\n",
        "        self.rows[req_id] = list(block_ids)\n",
    ),
    (
        "02.5",
        "rows not padded to the longest",
        "        return [self.rows[r] + [0] * (width - len(self.rows[r])) for r in req_ids]\n",
        "        return [self.rows[r] for r in req_ids]\n",
    ),
    ("02.5", "remove_row keeps the row", "        self.rows.pop(req_id, None)\n", "        pass\n"),
    (
        "02.6",
        "add_row keeps the caller's list, not a copy",
        "        self.rows[req_id] = list(block_ids)  # a copy: the caller owns its list and may change it\n",
        "        self.rows[req_id] = block_ids\n",
    ),
    (
        "02.6",
        "rows padded to the longest row of all, not of those asked for",
        "        width = max(len(self.rows[r]) for r in req_ids)\n",
        "        width = max(len(self.rows[r]) for r in self.rows)\n",
    ),
    (
        "02.6",
        "a readmitted request's row continues its old one",
        "        self.rows[req_id] = list(block_ids)  # a copy: the caller owns its list and may change it\n",
        "        self.rows.setdefault(req_id, []).extend(block_ids)\n",
    ),
    (
        "02.5b",
        "slots computed from the start of the request at every step",
        "return slot_mapping(self.rows[req_id], start_pos, num_tokens, self.block_size)",
        "return slot_mapping(self.rows[req_id], 0, num_tokens, self.block_size)",
    ),
    (
        "02.5b",
        "append_row replaces the row",
        "        self.rows[req_id].extend(block_ids)\n",
        "        self.rows[req_id] = list(block_ids)\n",
    ),
]
