"""Chapter 01 exercises: what the KV cache costs in bytes, and attention over it.

Check your work with:   make grade CH=01
Stuck? In the notebook, `from nanocourse import hint; hint("01")` lists this chapter's hints, from a nudge to
close-to-code; open them one at a time with hint("01", n).
"""

from __future__ import annotations

import torch


def kv_bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, dtype_bytes: int) -> int:
    """Task 01.1: the bytes one token's keys and values take, summed over every layer.

    Contract: all arguments are positive ints; dtype_bytes is the size of one cached number (4 for fp32, 2 for
    fp16 or bf16, 1 for fp8). Every layer caches, for each token, one key vector and one value vector per KV
    head, each of head_dim numbers. Query heads do not enter: only K and V are cached. The result is an exact
    int, equal to the engine's LlamaConfig.kv_bytes_per_token(dtype_bytes) (nanoengine/config.py).
    (vLLM 0.33: AttentionSpec.page_size_bytes in vllm/v1/kv_cache_interface.py, one layer's page, for a plain
    attention layer num_kv_heads x block_size x (head_size + head_size_v) x the dtype's size;
    _get_kv_cache_bytes_per_block in vllm/v1/core/kv_cache_planning.py sums the pages of every layer.)
    Example: SmolLM2-135M (30 layers, 3 KV heads, head_dim 64) in fp32: kv_bytes_per_token(30, 3, 64, 4) ==
    46_080; in bf16 half of that, 23_040.
    """
    raise NotImplementedError


def kv_bytes_per_block(block_size: int, num_layers: int, num_kv_heads: int, head_dim: int, dtype_bytes: int) -> int:
    """Task 01.2: the bytes one KV block of block_size tokens takes, across all layers.

    Contract: positive ints as in kv_bytes_per_token; a block holds the keys and values of block_size tokens in
    every layer, so its bytes grow in proportion to block_size. Equal to the engine's
    PagedKVCache.bytes_per_block (nanoengine/attention/paged.py) for that model and dtype.
    (vLLM 0.33: the bytes_per_block of get_kv_cache_config_from_groups in vllm/v1/core/kv_cache_planning.py,
    from _get_kv_cache_bytes_per_block.)
    Example: Llama-70B (80 layers, 8 KV heads, head_dim 128) in fp16 with 16-token blocks:
    kv_bytes_per_block(16, 80, 8, 128, 2) == 5_242_880, 5.24 MB in powers of ten, exactly 5 MiB in powers of two.
    """
    raise NotImplementedError


def max_cached_tokens(budget_bytes: int, block_size: int, bytes_per_token: int) -> int:
    """Task 01.3: how many tokens a KV pool carved out of budget_bytes can hold.

    Contract: budget_bytes >= 0, block_size and bytes_per_token positive. The pool is made of whole blocks of
    block_size tokens; a leftover smaller than one block is wasted. Block 0 is the null block: it is allocated
    but never holds a real token, so it does not count. Returns the tokens the other blocks hold (a multiple of
    block_size). A budget that gives fewer than two whole blocks cannot serve anything: it raises MemoryError
    (any subclass will do). The result is what the engine's own pool sizing leaves for tokens, whose
    KVCacheTooSmallError is a MemoryError (num_kv_blocks in nanoengine/worker/worker.py).
    (vLLM 0.33: get_kv_cache_config_from_groups in vllm/v1/core/kv_cache_planning.py,
    num_blocks = available_memory // bytes_per_block; BlockPool.__init__ in vllm/v1/core/block_pool.py pops the
    first free block as its null_block. vLLM's own check, _check_enough_kv_cache_memory, raises ValueError.)
    Example: the engine's default CPU budget, 512 MiB, with SmolLM2 in fp32 (46,080 bytes a token) in blocks of
    16: max_cached_tokens(512 * 2**20, 16, 46_080) == 11_632; a budget one byte short of two blocks,
    max_cached_tokens(2 * 16 * 46_080 - 1, 16, 46_080), raises MemoryError.
    """
    raise NotImplementedError


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> torch.Tensor:
    """Task 01.4: one new token attends over everything in the cache (a decode step).

    q:       [num_heads, head_dim], the new token's queries (RoPE already applied)
    k_cache: [seq_len, num_kv_heads, head_dim], keys of every token so far, the new one included
    v_cache: [seq_len, num_kv_heads, head_dim]
    returns: [num_heads, head_dim] in q's dtype (the three inputs share one dtype: float32, float16 or bfloat16).

    Contract: for each query head h, softmax attention of q[h] over the seq_len cached keys of its KV head,
    with scores scaled by 1 / sqrt(head_dim) (whatever head_dim is), and the softmax-weighted sum of the
    matching values. Grouped-query attention: num_heads is a multiple of num_kv_heads, and query head h reads KV
    head h // (num_heads // num_kv_heads), so consecutive query heads share a KV head. No mask: a decode token
    sees every cached token, and seq_len may be 1. Large scores (q scaled by 1000) must not overflow: the result
    stays finite. q, k_cache and v_cache are left as they were. The values agree with exact attention
    (torch's scaled_dot_product_attention with enable_gqa, in float64) to within max(1e-4, 4 x eps of q's dtype)
    relative to 1 + |value|; working in float32 and casting the result back keeps well inside that.
    (vLLM 0.33: kernel_paged_attention_2d in vllm/v1/attention/ops/chunked_prefill_paged_decode.py, where KV
    head kv_head_idx serves query heads kv_head_idx * num_queries_per_kv + [0, num_queries_per_kv) and the
    softmax is accumulated in float32; the scale is LlamaAttention's self.scaling = self.head_dim**-0.5 in
    vllm/model_executor/models/llama.py.)
    Example: 4 query heads over 2 KV heads, head_dim 2, 2 cached tokens:
        q = [[1, 0], [0, 1], [1, 1], [0, 0]]
        k_cache = [[[1, 0], [0, 0]], [[0, 1], [0, 0]]]     (KV head 1's keys are all zero)
        v_cache = [[[1, 2], [5, 6]], [[3, 4], [7, 8]]]
    gives [[1.6605, 2.6605], [2.3395, 3.3395], [6.0, 7.0], [6.0, 7.0]] (4 decimals): heads 0 and 1 read KV head
    0 (head 0 weighs token 0 by e^(1/sqrt 2) against 1 for token 1); heads 2 and 3 read KV head 1, whose zero
    keys give both tokens equal weight, so they get the mean of its values.
    """
    raise NotImplementedError
