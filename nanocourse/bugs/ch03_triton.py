"""Seeded bugs for chapter 03: the worked solution with one mistake a learner could make."""

BUGS = [
    # (task id that must fail, the mistake, text found exactly once in solutions/ch03_triton.py, its replacement)
    (
        "03.1",
        "the offset inside the block is dropped",
        "dst = (slot // BLOCK_SIZE) * s_cb + (slot % BLOCK_SIZE) * s_ct + h * s_ch + d",
        "dst = (slot // BLOCK_SIZE) * s_cb + h * s_ch + d",
    ),
    (
        "03.1",
        "a plain torch copy instead of the kernel",
        "    num_tokens, num_kv_heads, head_dim = k.shape\n    _store_kernel[",
        (
            "    num_tokens, num_kv_heads, head_dim = k.shape\n    from nanoengine.attention.backend import TorchBackend\n"
            "    return TorchBackend().store_kvcache(k, v, k_cache, v_cache, slot_mapping)\n    _store_kernel["
        ),
    ),
    ("03.1b", "slot -1 is not skipped", "    if slot >= 0:\n", "    if slot >= -1:\n"),
    (
        "03.1b",
        "the heads are not masked: a 4th, padded head is written",
        "        mask = h < num_kv_heads\n",
        "        mask = h < HEADS_PAD\n",
    ),
    (
        "03.1c",
        "the slot narrowed to int32: a block 2**32 elements in wraps",
        "slot = tl.load(slot_ptr + token).to(tl.int64)",
        "slot = tl.load(slot_ptr + token).to(tl.int32)",
    ),
    (
        "03.1c",
        "a store that ignores padding: slot -1 writes the row before the cache",
        "    if slot >= 0:\n",
        "    if slot >= -1:\n",
    ),
    (
        "03.1c",
        "the first slot taken for padding",
        "    if slot >= 0:\n",
        "    if slot > 0:\n",
    ),
    (
        "03.2",
        "repeat instead of repeat_interleave for the GQA groups",
        "keys = k_cache[blocks].flatten(0, 1)[:seq_len].repeat_interleave(group, dim=1)",
        "keys = k_cache[blocks].flatten(0, 1)[:seq_len].repeat(1, group, 1)",
    ),
    (
        "03.2",
        "the last block read whole, past seq_len",
        "values = v_cache[blocks].flatten(0, 1)[:seq_len].repeat_interleave(group, dim=1)",
        "values = v_cache[blocks].flatten(0, 1).repeat_interleave(group, dim=1)",
    ),
    (
        "03.2",
        "no scale on the scores",
        'probs = (torch.einsum("hd,lhd->hl", q, keys) * scale).softmax(-1)',
        'probs = torch.einsum("hd,lhd->hl", q, keys).softmax(-1)',
    ),
    (
        "03.3",
        "partials summed without rescaling to the common max",
        "weight = torch.exp(m - m_max.nan_to_num(neginf=0.0))  # an empty split (m = -inf) weighs 0",
        "weight = torch.ones_like(m)",
    ),
    (
        "03.3",
        "an all-empty row divides by zero",
        "return out / torch.where(total > 0, total, 1.0)",
        "return out / total",
    ),
    (
        "03.3",
        "no split at all: amax over an empty axis raises",
        (
            "    if m.shape[-1] == 0:  # no split at all attends to nothing, like a row of empty splits: zeros\n"
            "        return acc.new_zeros(*acc.shape[:-2], acc.shape[-1])\n"
        ),
        "",
    ),
    (
        "03.3",
        "no split at all returns [..., S] = [..., 0] instead of [..., D]",
        "return acc.new_zeros(*acc.shape[:-2], acc.shape[-1])",
        "return acc.new_zeros(acc.shape[:-1])",
    ),
    (
        "03.4",
        "the last block read whole: padding past seq_len leaks in",
        "        mask = start + t < seq_len\n",
        "        mask = t < BLOCK_SIZE\n",
    ),
    (
        "03.4",
        "K loaded without the mask: the tail of the last block is read, then its scores dropped",
        "k = tl.load(k_cache_ptr + rows[:, None] + d[None, :], mask=mask[:, None], other=0.0).to(tl.float32)",
        "k = tl.load(k_cache_ptr + rows[:, None] + d[None, :]).to(tl.float32)",
    ),
    ("03.4", "every query head reads KV head 0", "    kv_head = head // GROUP\n", "    kv_head = head * 0\n"),
    (
        "03.4",
        "the block table row of request 0 for everyone",
        "        block = tl.load(table_ptr + seq * s_bt + start // BLOCK_SIZE).to(tl.int64)",
        "        block = tl.load(table_ptr + start // BLOCK_SIZE).to(tl.int64)",
    ),
    (
        "03.4",
        "an online softmax that does not rescale when the maximum moves",
        "        alpha = tl.exp(m_i - m_new)\n",
        "        alpha = 1.0\n",
    ),
    (
        "03.4",
        "no running maximum subtracted: exp of a large score overflows",
        "m_new = tl.maximum(m_i, tl.max(s, 0))",
        "m_new = tl.maximum(m_i, 0.0)",
    ),
    ("03.4b", "an empty context divides 0 by 0", "    out = acc / tl.where(l_i > 0, l_i, 1.0)", "    out = acc / l_i"),
    (
        "03.4b",
        "an empty context yields q instead of zeros",
        "    out = acc / tl.where(l_i > 0, l_i, 1.0)",
        "    out = tl.where(l_i > 0, acc / tl.where(l_i > 0, l_i, 1.0), q)",
    ),
    (
        "03.4c",
        "the block id stays int32: block * s_cb wraps past 2**31",
        "        block = tl.load(table_ptr + seq * s_bt + start // BLOCK_SIZE).to(tl.int64)",
        "        block = tl.load(table_ptr + seq * s_bt + start // BLOCK_SIZE)",
    ),
    (
        "03.4c",
        "the cast comes after the multiply, which has already wrapped",
        (
            "        block = tl.load(table_ptr + seq * s_bt + start // BLOCK_SIZE).to(tl.int64)\n"
            "        mask = start + t < seq_len\n"
            "        rows = block * s_cb + t * s_ct + kv_head * s_ch\n"
        ),
        (
            "        block = tl.load(table_ptr + seq * s_bt + start // BLOCK_SIZE)\n"
            "        mask = start + t < seq_len\n"
            "        rows = (block * s_cb).to(tl.int64) + t * s_ct + kv_head * s_ch\n"
        ),
    ),
    (
        "03.7",
        "K loaded without the mask: the tail of the last block is read, then its scores dropped",
        "k = tl.load(k_cache_ptr + rows[:, None] + d[None, :], mask=mask[:, None], other=0.0).to(tl.float32)",
        "k = tl.load(k_cache_ptr + rows[:, None] + d[None, :]).to(tl.float32)",
    ),
    (
        "03.7",
        "off by one: each token also sees the next one",
        "lens += range(seq_len - n + 1, seq_len + 1)",
        "lens += [min(x + 1, seq_len) for x in range(seq_len - n + 1, seq_len + 1)]",
    ),
    (
        "03.5",
        "off by one: each token also sees the next one",
        "lens += range(seq_len - n + 1, seq_len + 1)",
        "lens += [min(x + 1, seq_len) for x in range(seq_len - n + 1, seq_len + 1)]",
    ),
    (
        "03.5",
        "every new token sees the whole chunk (no causal mask)",
        "lens += range(seq_len - n + 1, seq_len + 1)",
        "lens += [seq_len] * n",
    ),
    (
        "03.5",
        "the decode rows' block ids stay int32, so a far block wraps",
        "        block = tl.load(table_ptr + seq * s_bt + start // BLOCK_SIZE).to(tl.int64)",
        "        block = tl.load(table_ptr + seq * s_bt + start // BLOCK_SIZE)",
    ),
    (
        "03.5",
        "a torch fallback instead of the kernel",
        "    starts = query_start_loc.tolist()\n    rows, lens = [], []\n",
        (
            "    from nanoengine.attention.backend import TorchBackend\n"
            "    return TorchBackend().prefill(q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, max_query_len, scale)\n"
            "    starts = query_start_loc.tolist()\n    rows, lens = [], []\n"
        ),
    ),
    (
        "03.6",
        "every new token sees the whole chunk (no causal mask)",
        "lens += range(seq_len - n + 1, seq_len + 1)",
        "lens += [seq_len] * n",
    ),
    (
        "03.6",
        "decode reads the table row of request 0 for everyone",
        "        block = tl.load(table_ptr + seq * s_bt + start // BLOCK_SIZE).to(tl.int64)",
        "        block = tl.load(table_ptr + start // BLOCK_SIZE).to(tl.int64)",
    ),
]
