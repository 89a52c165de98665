"""CUDA graphs for decode steps: each batch size captured once, then replayed with new inputs.

Why: a SmolLM2 decode step launches hundreds of small kernels (30 layers of norms, matmuls, RoPE,
store and attention), and in eager mode Python issues every launch while the GPU waits. On an H100
one Triton decode call at Llama-3-8B's heads took 147 us eager and 17 us replayed from a graph at
batch 1 (bench/results/attention_h100-80gb-hbm3.json). A graph records the launches once; a replay issues
them all in one call. nano-vllm does this in `ModelRunner.capture_cudagraph`; vLLM wraps the model
in `CUDAGraphWrapper` and likewise pads a batch up to the next captured size. `LLM(enforce_eager=True)`
turns it off, as in vLLM.

Invariants:
- A captured kernel reads fixed addresses, so every input lives in a static buffer that `replay`
  overwrites in place; the logits come out in a static buffer too, valid until the next replay.
- Rows past the live batch are padding: slot -1 (the store skips it) and seq_len 0; their token and
  position are whatever an earlier replay left. Every op is row-wise, so padding rows never touch live
  ones, and their logits are dropped.
- The block table is max_model_len / block_size wide, so the decode kernel chooses its split-K
  factor once for the longest context; block ids past a row's seq_len are never read.
- Only pure-decode steps replay (vLLM's non-default FULL_DECODE_ONLY mode): graphing a prefill as vLLM's default
  FULL_AND_PIECEWISE does needs the model cut at attention into pieces, which vLLM's torch.compile pass does and
  nanoengine has no compiler for.
"""

from __future__ import annotations

import torch

from nanoengine.attention.backend import AttentionMetadata
from nanoengine.attention.paged import PagedKVCache
from nanoengine.model import LlamaForCausalLM

# vLLM captures 1, 2, 4, then multiples of 8 up to 256 and of 16 beyond (its cudagraph_capture_sizes);
# powers of two keep the count, and the capture time, small for an engine serving small batches.
CAPTURE_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


class DecodeGraphs:
    def __init__(self, model: LlamaForCausalLM, kv_cache: PagedKVCache, max_num_seqs: int, max_model_len: int):
        device = kv_cache.k_caches[0].device
        self.sizes = [s for s in CAPTURE_SIZES if s < max_num_seqs] + [max_num_seqs]
        n, width = self.sizes[-1], -(-max_model_len // kv_cache.block_size)
        self.input_ids = torch.zeros(n, dtype=torch.int64, device=device)
        self.positions = torch.zeros(n, dtype=torch.int64, device=device)
        self.slot_mapping = torch.full((n,), -1, dtype=torch.int64, device=device)
        self.seq_lens = torch.zeros(n, dtype=torch.int32, device=device)
        self.block_tables = torch.zeros(n, width, dtype=torch.int32, device=device)
        self.query_start_loc = torch.arange(n + 1, dtype=torch.int32, device=device)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.logits: dict[int, torch.Tensor] = {}
        self.num_replays = 0
        pool = None
        for size in reversed(self.sizes):  # largest first: the smaller graphs reuse its memory pool
            self.graphs[size], self.logits[size] = self._capture(model, kv_cache, size, max_model_len, pool)
            pool = self.graphs[size].pool()

    def _capture(self, model, kv_cache, size, max_model_len, pool):
        kv_cache.metadata = AttentionMetadata(
            slot_mapping=self.slot_mapping[:size],
            query_start_loc=self.query_start_loc[: size + 1],
            seq_lens=self.seq_lens[:size],
            block_tables=self.block_tables[:size],
            max_query_len=1,
            max_seq_len=max_model_len,
            num_decodes=size,
        )

        def step():
            return model.compute_logits(model(self.input_ids[:size], self.positions[:size], kv_cache))

        with torch.inference_mode():
            step()  # compiles the kernels and settles the allocator outside the capture
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                logits = step()
        return graph, logits

    def can_replay(self, md: AttentionMetadata, num_reqs: int) -> bool:
        return md.num_decodes == num_reqs <= self.sizes[-1] and md.block_tables.shape[1] <= self.block_tables.shape[1]

    def replay(self, input_ids: torch.Tensor, positions: torch.Tensor, md: AttentionMetadata) -> torch.Tensor:
        """Logits [n, vocab] of a pure-decode step of n requests (see can_replay)."""
        n = input_ids.shape[0]
        size = next(s for s in self.sizes if s >= n)
        self.input_ids[:n] = input_ids
        self.positions[:n] = positions
        self.slot_mapping[:n] = md.slot_mapping
        self.slot_mapping[n:size] = -1
        self.seq_lens[:n] = md.seq_lens
        self.seq_lens[n:size] = 0
        self.block_tables[:n, : md.block_tables.shape[1]] = md.block_tables
        self.graphs[size].replay()
        self.num_replays += 1
        return self.logits[size][:n]
