"""Seeded bugs for chapter 06: the worked solution with one mistake a learner could make."""

BUGS = [
    # (task id that must fail, the mistake, text found exactly once in solutions/ch06_prefix_caching.py, its replacement)
    # 06.1: get_computed_blocks
    (
        "06.1",
        "no num_tokens - 1 rule: a block-aligned prompt would skip its last token",
        "max_length = request.num_tokens - 1",
        "max_length = request.num_tokens",
    ),
    (
        "06.1",
        "max_length passed in blocks, not tokens",
        "max_length = request.num_tokens - 1",
        "max_length = (request.num_tokens - 1) // self.block_size",
    ),
    (
        "06.1",
        "the lookup touches what it finds",
        "        if record_stats:\n            self.record_prefix_cache_stats(",
        "        self.block_pool.touch(hits[0])\n        if record_stats:\n            self.record_prefix_cache_stats(",
    ),
    (
        "06.1",
        "the lookup is never counted",
        "        if record_stats:\n            self.record_prefix_cache_stats(request, num_hit_tokens)\n",
        "",
    ),
    (
        "06.1",
        "the lookup counted even when record_stats is off",
        "        if record_stats:\n            self.record_prefix_cache_stats(request, num_hit_tokens)\n",
        "        self.record_prefix_cache_stats(request, num_hit_tokens)\n",
    ),
    (
        "06.1",
        "the stats count the hit's cap, not the tokens it covers",
        "            self.record_prefix_cache_stats(request, num_hit_tokens)",
        "            self.record_prefix_cache_stats(request, max_length)",
    ),
    (
        "06.1",
        "a request that skips reading the prefix cache (prompt logprobs) still gets a hit",
        "        if not self.enable_caching or request.skip_reading_prefix_cache:\n",
        "        if not self.enable_caching:\n",
    ),
    # 06.2: BlockPool.free_blocks order
    (
        "06.2",
        "unhashed blocks to the tail",
        "self.free_block_queue.prepend_n([block for block in freed if block.block_hash is None])",
        "self.free_block_queue.append_n([block for block in freed if block.block_hash is None])",
    ),
    (
        "06.2",
        "unhashed blocks queued at the head in reverse order",
        "self.free_block_queue.prepend_n([block for block in freed if block.block_hash is None])",
        "self.free_block_queue.prepend_n([block for block in freed if block.block_hash is None][::-1])",
    ),
    (
        "06.2",
        "hashed blocks to the head",
        "self.free_block_queue.append_n([block for block in freed if block.block_hash is not None])",
        "self.free_block_queue.prepend_n([block for block in freed if block.block_hash is not None])",
    ),
    # 06.2b: shared blocks, the null block, double frees, FullAttentionManager.free
    (
        "06.2b",
        "free releases the request first to last",
        "self.block_pool.free_blocks(reversed(self.req_to_blocks.get(request_id, [])))",
        "self.block_pool.free_blocks(self.req_to_blocks.get(request_id, []))",
    ),
    (
        "06.2b",
        "every freed block goes to the queue, shared ones too",
        "freed = [block for i, block in enumerate(blocks) if block.ref_cnt == 0 and last[id(block)] == i]",
        "freed = blocks",
    ),
    (
        "06.2b",
        "a block listed twice is queued twice",
        "freed = [block for i, block in enumerate(blocks) if block.ref_cnt == 0 and last[id(block)] == i]",
        "freed = [block for block in blocks if block.ref_cnt == 0]",
    ),
    (
        "06.2b",
        "a block listed twice is queued at its first listing, not where its last reference goes",
        "freed = [block for i, block in enumerate(blocks) if block.ref_cnt == 0 and last[id(block)] == i]",
        "freed = list(dict.fromkeys(block for block in blocks if block.ref_cnt == 0))",
    ),
    (
        "06.2b",
        "a double free goes unnoticed",
        "        if any(block.ref_cnt < 0 for block in blocks):\n",
        "        if False:\n",
    ),
    (
        "06.2b",
        "free leaves the request's entry behind",
        "        self.req_to_blocks.pop(request_id, None)\n",
        "",
    ),
    (
        "06.2b",
        "free forgets the request before the pool takes its blocks back, so a refused free loses the record",
        (
            "        self.block_pool.free_blocks(reversed(self.req_to_blocks.get(request_id, [])))\n"
            "        self.req_to_blocks.pop(request_id, None)\n"
        ),
        "        blocks = self.req_to_blocks.pop(request_id, [])\n        self.block_pool.free_blocks(reversed(blocks))\n",
    ),
    # 06.3: KVCacheManager.allocate_slots
    (
        "06.3",
        "blocks are named with prefix caching off too",
        "        if self.enable_caching:\n            self.coordinator.cache_blocks(",
        "        if True:\n            self.coordinator.cache_blocks(",
    ),
    (
        "06.3b",
        "the whole-sequence gate runs after the window's blocks are given back",
        (
            "        if full_sequence_must_fit and not fits(request.num_tokens, admission=True):\n            return None\n"
            "        self.coordinator.remove_skipped_blocks(request_id, num_computed)\n"
        ),
        (
            "        self.coordinator.remove_skipped_blocks(request_id, num_computed)\n"
            "        if full_sequence_must_fit and not fits(request.num_tokens, admission=True):\n            return None\n"
        ),
    ),
    (
        "06.3",
        "lookahead tokens get no slots",
        "num_tokens_need_slot = num_computed + num_new_tokens + num_lookahead_tokens",
        "num_tokens_need_slot = num_computed + num_new_tokens",
    ),
    (
        "06.3",
        "tokens past num_tokens are named too",
        "self.coordinator.cache_blocks(request, min(num_computed + num_new_tokens, request.num_tokens))",
        "self.coordinator.cache_blocks(request, num_computed + num_new_tokens)",
    ),
    (
        "06.3",
        "lookahead slots are named too",
        "self.coordinator.cache_blocks(request, min(num_computed + num_new_tokens, request.num_tokens))",
        "self.coordinator.cache_blocks(request, min(num_tokens_need_slot, request.num_tokens))",
    ),
    (
        "06.3",
        "the hits are never taken",
        "        self.coordinator.allocate_new_computed_blocks(request_id, hits, num_computed)\n",
        "",
    ),
    (
        "06.3",
        "new blocks taken before the hits: the hits' list drops them, and a new block may evict a free hit",
        (
            "        self.coordinator.allocate_new_computed_blocks(request_id, hits, num_computed)\n"
            "        new_blocks = self.coordinator.allocate_new_blocks(request_id, num_tokens_need_slot)\n"
        ),
        (
            "        new_blocks = self.coordinator.allocate_new_blocks(request_id, num_tokens_need_slot)\n"
            "        self.coordinator.allocate_new_computed_blocks(request_id, hits, num_computed)\n"
        ),
    ),
    (
        "06.3",
        "full blocks are never named",
        "        if self.enable_caching:\n            self.coordinator.cache_blocks(",
        "        if False:\n            self.coordinator.cache_blocks(",
    ),
    # 06.3b: all or nothing, and the admission gate
    (
        "06.3b",
        "partial allocation on failure: the hits are taken before the room is checked",
        "        self.coordinator.remove_skipped_blocks(request_id, num_computed)\n",
        (
            "        self.coordinator.remove_skipped_blocks(request_id, num_computed)\n"
            "        self.coordinator.allocate_new_computed_blocks(request_id, hits, num_computed)\n"
        ),
    ),
    (
        "06.3b",
        "blocks behind a sliding window are given back only after the room is counted",
        "        self.coordinator.remove_skipped_blocks(request_id, num_computed)\n        num_tokens_need_slot = num_computed + num_new_tokens + num_lookahead_tokens\n        if not fits(num_tokens_need_slot):\n            return None\n",
        "        num_tokens_need_slot = num_computed + num_new_tokens + num_lookahead_tokens\n        if not fits(num_tokens_need_slot):\n            return None\n        self.coordinator.remove_skipped_blocks(request_id, num_computed)\n",
    ),
    (
        "06.3b",
        "the gate ignores the hits",
        "        if full_sequence_must_fit and not fits(request.num_tokens, admission=True):\n",
        (
            "        if full_sequence_must_fit and self.coordinator.get_num_blocks_to_allocate(\n"
            "                request_id, request.num_tokens, self.empty_kv_cache_blocks.blocks, num_computed, True\n"
            "        ) > self.block_pool.get_num_free_blocks():\n"
        ),
    ),
    (
        "06.3b",
        "the whole-sequence gate counts the lookahead slots as part of the sequence",
        "        if full_sequence_must_fit and not fits(request.num_tokens, admission=True):\n",
        "        if full_sequence_must_fit and not fits(request.num_tokens + num_lookahead_tokens, admission=True):\n",
    ),
    (
        "06.3b",
        "full_sequence_must_fit ignored: the gate admits a prompt whose first chunk fits",
        "        if full_sequence_must_fit and not fits(request.num_tokens, admission=True):\n            return None\n",
        "",
    ),
    (
        "06.3b",
        "the room is checked without the hits",
        "                request_id, num_tokens, hits, num_computed, apply_admission_cap=admission\n            )\n",
        (
            "                request_id, num_tokens, self.empty_kv_cache_blocks.blocks, num_computed,\n"
            "                apply_admission_cap=admission,\n            )\n"
            "            needed -= sum(len(group) for group in hits)\n"
        ),
    ),
    # 06.3c: FullAttentionManager.get_num_blocks_to_allocate
    (
        "06.3c",
        "a free cached hit costs nothing",
        "        return num_new + sum(block.ref_cnt == 0 for block in new_computed_blocks)\n",
        "        return num_new\n",
    ),
    (
        "06.3c",
        "every hit costs a free block, held ones too",
        "        return num_new + sum(block.ref_cnt == 0 for block in new_computed_blocks)\n",
        "        return num_new + len(new_computed_blocks)\n",
    ),
    (
        "06.3c",
        "a running request's held blocks are not counted",
        "            return max(num_required - num_held, 0)\n",
        "            return num_required\n",
    ),
    (
        "06.3c",
        "a running request's hits are taken as new ones",
        "        if request_id in self.num_cached_block:  # running: it takes no new hits\n",
        "        if request_id in self.num_cached_block and not new_computed_blocks:\n",
    ),
    # 06.6: serving the real engine
    (
        "06.6",
        "allocate_slots hands the engine the coordinator's bare lists, not KVCacheBlocks",
        "        return KVCacheBlocks(new_blocks)",
        "        return new_blocks",
    ),
    (
        "06.6",
        "hashed blocks to the head",
        "self.free_block_queue.append_n([block for block in freed if block.block_hash is not None])",
        "self.free_block_queue.prepend_n([block for block in freed if block.block_hash is not None])",
    ),
    (
        "06.6",
        "free releases the request first to last",
        "self.block_pool.free_blocks(reversed(self.req_to_blocks.get(request_id, [])))",
        "self.block_pool.free_blocks(self.req_to_blocks.get(request_id, []))",
    ),
    (
        "06.6",
        "no num_tokens - 1 rule: the engine is left with nothing to compute",
        "max_length = request.num_tokens - 1",
        "max_length = request.num_tokens",
    ),
    (
        "06.6",
        "blocks a sliding window left behind are never given back",
        "        self.coordinator.remove_skipped_blocks(request_id, num_computed)\n",
        "",
    ),
    # 06.7: random workloads
    (
        "06.7",
        "the whole sequence counted from the prompt only, without the tokens generated before a preemption",
        "not fits(request.num_tokens, admission=True)",
        "not fits(request.num_prompt_tokens, admission=True)",
    ),
    (
        "06.7",
        "a request that skips reading the prefix cache (prompt logprobs) still gets a hit",
        "        if not self.enable_caching or request.skip_reading_prefix_cache:\n",
        "        if not self.enable_caching:\n",
    ),
    (
        "06.7",
        "the lookup counted in the stats even when record_stats is off",
        "        if record_stats:\n            self.record_prefix_cache_stats(request, num_hit_tokens)\n",
        "        self.record_prefix_cache_stats(request, num_hit_tokens)\n",
    ),
    (
        "06.7",
        "free releases the request first to last",
        "self.block_pool.free_blocks(reversed(self.req_to_blocks.get(request_id, [])))",
        "self.block_pool.free_blocks(self.req_to_blocks.get(request_id, []))",
    ),
    (
        "06.7",
        "unhashed blocks to the tail",
        "self.free_block_queue.prepend_n([block for block in freed if block.block_hash is None])",
        "self.free_block_queue.append_n([block for block in freed if block.block_hash is None])",
    ),
    (
        "06.7",
        "a free cached hit costs nothing",
        "        return num_new + sum(block.ref_cnt == 0 for block in new_computed_blocks)\n",
        "        return num_new\n",
    ),
    (
        "06.7",
        "the gate ignores the hits",
        "        if full_sequence_must_fit and not fits(request.num_tokens, admission=True):\n",
        (
            "        if full_sequence_must_fit and self.coordinator.get_num_blocks_to_allocate(\n"
            "                request_id, request.num_tokens, self.empty_kv_cache_blocks.blocks, num_computed, True\n"
            "        ) > self.block_pool.get_num_free_blocks():\n"
        ),
    ),
    # 06.8: place_freed, an open design graded by its invariants and its hit rate
    (
        "06.8",
        "the naive order: every freed block to the tail, the request's first block first",
        (
            "    queue.prepend_n([block for block in freed if block.block_hash is None])  # nobody can hit these: first out\n"
            "    queue.append_n([block for block in reversed(freed) if block.block_hash is not None])  # a chain's root last\n"
        ),
        "    queue.append_n(freed)\n",
    ),
    (
        "06.8",
        "unhashed blocks first, but a freed chain queued root first: the root is evicted before its tail",
        "    queue.append_n([block for block in reversed(freed) if block.block_hash is not None])  # a chain's root last\n",
        "    queue.append_n([block for block in freed if block.block_hash is not None])\n",
    ),
    (
        "06.8",
        "blocks without a hash are never queued again (leaked)",
        "    queue.prepend_n([block for block in freed if block.block_hash is None])  # nobody can hit these: first out\n",
        "",
    ),
]
