"""Seeded bugs for chapter 01: the worked solution with one mistake a learner could make."""

BUGS = [
    # (task id that must fail, the mistake, text found exactly once in solutions/ch01_kv_cache.py, its replacement)
    (
        "01.1",
        "keys only: the values forgotten",
        "return 2 * num_layers * num_kv_heads * head_dim * dtype_bytes",
        "return num_layers * num_kv_heads * head_dim * dtype_bytes",
    ),
    (
        "01.1",
        "the element size forgotten",
        "return 2 * num_layers * num_kv_heads * head_dim * dtype_bytes",
        "return 2 * num_layers * num_kv_heads * head_dim",
    ),
    (
        "01.2",
        "one layer's block",
        "return block_size * kv_bytes_per_token(num_layers, num_kv_heads, head_dim, dtype_bytes)",
        "return block_size * kv_bytes_per_token(1, num_kv_heads, head_dim, dtype_bytes)",
    ),
    (
        "01.2",
        "one token's bytes",
        "return block_size * kv_bytes_per_token(num_layers, num_kv_heads, head_dim, dtype_bytes)",
        "return kv_bytes_per_token(num_layers, num_kv_heads, head_dim, dtype_bytes)",
    ),
    (
        "01.3",
        "the null block counted as usable",
        "return (num_blocks - 1) * block_size",
        "return num_blocks * block_size",
    ),
    ("01.3", "a pool of one block accepted", "    if num_blocks < 2:\n", "    if num_blocks < 1:\n"),
    (
        "01.3",
        "the blocks rounded up: a partial block counted as whole",
        "num_blocks = budget_bytes // (block_size * bytes_per_token)",
        "num_blocks = -(-budget_bytes // (block_size * bytes_per_token))",
    ),
    (
        "01.4",
        "repeat instead of repeat_interleave for the GQA groups",
        "k = k_cache.repeat_interleave(group, dim=1).float()",
        "k = k_cache.repeat(1, group, 1).float()",
    ),
    (
        "01.4",
        "no 1/sqrt(head_dim) scale",
        'scores = torch.einsum("hd,shd->hs", q.float(), k) * q.shape[-1] ** -0.5',
        'scores = torch.einsum("hd,shd->hs", q.float(), k)',
    ),
    ("01.4", "the scale hard-coded for SmolLM2's head_dim of 64", "* q.shape[-1] ** -0.5", "* 64 ** -0.5"),
    (
        "01.4",
        "the output left in float32 whatever q's dtype",
        "scores.softmax(dim=-1), v).to(q.dtype)",
        "scores.softmax(dim=-1), v)",
    ),
    ("01.5", "softmax over the heads, not the cached tokens", "scores.softmax(dim=-1)", "scores.softmax(dim=0)"),
    (
        "01.5",
        "values grouped with repeat instead of repeat_interleave",
        "v = v_cache.repeat_interleave(group, dim=1).float()",
        "v = v_cache.repeat(1, group, 1).float()",
    ),
]
