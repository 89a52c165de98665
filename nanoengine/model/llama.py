"""A Llama decoder over a flat batch of tokens.

Like vLLM (and unlike Hugging Face) there is no batch dimension: the tokens of every request in a
step are concatenated into one [T] vector with their own positions. Attention is the only place
where requests must be kept apart, so the model hands it to an `attn` object that knows which
token belongs to which request and where each request's K/V live (see nanoengine.attention).
Everything else, the norms, projections and MLP, runs on all T tokens at once.
"""

from __future__ import annotations

import platform

import torch
import torch.nn.functional as F
from torch import nn

from nanoengine.attention import AttentionContext
from nanoengine.config import LlamaConfig

# F.linear on a CPU calls MKL's fp32 GEMM; on the AMD CPU CI runs on it is 2-3x slower than oneDNN's, which
# also gains from the weight being packed once into its blocked layout (bench/gemm.py). vLLM's CPU backend
# makes the same choice (dispatch_cpu_unquantized_gemm).
ONEDNN_LINEAR = (
    platform.machine().lower() in ("x86_64", "amd64")
    and torch.backends.mkldnn.is_available()
    and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
)


# Whether the CPU computes bf16 natively (AVX512-BF16 or AMX). oneDNN (torch.ops.mkldnn._is_mkldnn_bf16_supported)
# also takes bf16 on a plain AVX-512 CPU, converting every operand in its kernel: there a layer's four bf16 GEMMs of
# 32 rows took 4.1 ms against 1.2 ms in fp32 (2 Xeon cores with AVX-512 and VNNI only), while one row, which reading
# the weight bounds, was still faster in bf16, from half the bytes.
CPU_BF16 = torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()


class Linear(nn.Linear):
    """nn.Linear that runs fp32 and bf16 CPU inference through oneDNN with a pre-packed weight.

    Same math as F.linear in the same dtype; only the summation order differs. Where the CPU has no native bf16
    (CPU_BF16), a bf16 weight multiplies more than one row in fp32: the weight widened exactly, the product rounded
    to bf16 once, as a bf16 GEMM (which accumulates in fp32) rounds it.
    Packed copies are keyed on the weight's storage and version counter, so loading new weights or editing them in
    place repacks. Each is made on the first CPU call that needs it and holds as many bytes as the weight in its
    compute dtype.
    """

    packed: dict | None = None  # compute dtype -> (key, packed weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight
        if not (
            ONEDNN_LINEAR
            and x.device.type == "cpu"
            and x.dtype == w.dtype
            and w.dtype in (torch.float32, torch.bfloat16)
            and not w.requires_grad
        ):
            return F.linear(x, w, self.bias)
        if w.dtype is torch.bfloat16 and not CPU_BF16 and x.numel() > x.shape[-1]:
            bias = None if self.bias is None else self.bias.float()
            out = torch.ops.mkldnn._linear_pointwise(x.float(), self._packed(torch.float32), bias, "none", [], "")
            return out.to(x.dtype)
        return torch.ops.mkldnn._linear_pointwise(x, self._packed(w.dtype), self.bias, "none", [], "")

    def _packed(self, dtype: torch.dtype) -> torch.Tensor:
        w = self.weight
        # Tensors made under inference_mode have no version counter; only a new storage repacks those.
        key = (w.data_ptr(), None if w.is_inference() else w._version)
        if self.packed is None:
            self.packed = {}
        entry = self.packed.get(dtype)
        if entry is None or entry[0] != key:
            # 32 is the batch size oneDNN tunes the layout for; any batch size still works.
            entry = self.packed[dtype] = (key, torch.ops.mkldnn._reorder_linear_weight(w.to(dtype), 32))
        return entry[1]


class Int8WeightOnlyLinear(nn.Module):
    """A bias-free Linear whose weight is kept as int8 with one fp scale per output row (symmetric,
    scale = max|row| / 127); activations stay in the model's dtype. torch's own CPU kernel
    (aten._weight_int8pack_mm, which torchao's int8 weight-only config also calls) reads a quarter of fp32's bytes.

    Invariant: weight_int8 [N, K] int8 and scales [N] in the dtype of the inputs it is called with.
    """

    def __init__(self, linear: nn.Linear):
        super().__init__()
        w = linear.weight.detach().float()
        # clamp: an all-zero row would divide by zero; its int8 row is zeros whatever the scale.
        scales = w.abs().amax(dim=1).clamp(min=torch.finfo(torch.float32).tiny) / 127
        self.register_buffer("weight_int8", torch.round(w / scales[:, None]).to(torch.int8))
        self.register_buffer("scales", scales.to(linear.weight.dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.aten._weight_int8pack_mm(x, self.weight_int8, self.scales)


class Int8RowLinear(Int8WeightOnlyLinear):
    """Int8WeightOnlyLinear for a step of one row, and a dense Linear of the same int8 weights (in the model's dtype)
    for more: aten._weight_int8pack_mm's time grows with the rows (16 rows of SmolLM2's lm_head: 9.3 ms against
    1.1 ms for one, alone), where a dense GEMM reads the weight once (16 requests at once decoded 3-4% faster). A
    request's tokens depend on the rows beside it only as Q4GroupLinear's do: by rounding."""

    def __init__(self, linear: nn.Linear):
        super().__init__(linear)
        self.dense = Linear(linear.in_features, linear.out_features, bias=False, device="meta")
        weight = self.weight_int8.to(self.scales.dtype) * self.scales[:, None]
        self.dense.weight = nn.Parameter(weight, requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x) if x.shape[0] == 1 else self.dense(x)


def quantize_int8_weight_only_(model: nn.Module, dtype: torch.dtype) -> nn.Module:
    """Replace every Linear of model (the projections and lm_head; not the embedding) by its int8 weight-only
    form, in place, and return it in dtype. A tied lm_head gets its own int8 copy; the embedding keeps dtype."""
    model.to(dtype)
    for parent in list(model.modules()):
        for name, child in parent.named_children():
            if isinstance(child, nn.Linear):
                setattr(parent, name, Int8WeightOnlyLinear(child))
    return model


def q4_groups(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """(q [N, K] in 0..15, step and minimum [N, K / 32]) with weight == minimum + step * q in every group of 32
    along K (a GGUF's Q4_1 form, which holds the minimum and the maximum at q 0 and 15), to fp32 rounding; None
    where the weight has another form."""
    n, k = weight.shape
    if k % Q4GroupLinear.GROUP:
        return None
    groups = weight.detach().float().reshape(n, k // Q4GroupLinear.GROUP, Q4GroupLinear.GROUP)
    low, high = groups.amin(-1), groups.amax(-1)
    step = (high - low) / 15
    q = torch.round((groups - low[..., None]) / torch.where(step > 0, step, 1)[..., None])
    if (q * step[..., None] + low[..., None] - groups).abs().amax() > 1e-6 * groups.abs().amax():
        return None
    return q.to(torch.int32).reshape(n, k), step, low


class Q4GroupLinear(nn.Module):
    """A bias-free Linear whose weight is 4-bit groups of 32 (q4_groups), kept twice: packed for a step of a few
    rows, which reading the weight bounds, through torch's own aten._weight_int4pack_mm_for_cpu (the kernel
    torchao's int4 CPU layout calls); and as the dense Linear for more rows, where oneDNN's GEMM is faster
    (bench/gemm.py --int4). Both compute the same weights; only the rounding of the activations' products differs.

    Invariant: weight_int4 packs q [N, K]; scales_and_zeros [K / 32, N, 2] holds (step, minimum + 8 * step) of
    each group, as the kernel computes a weight as (q - 8) * step + (minimum + 8 * step).
    """

    GROUP = 32
    # The most rows the 4-bit kernel serves; the dense GEMM is faster beyond them. Where the CPU has native bf16, from
    # 8 rows (python bench/gemm.py --int4). Where it has not, the dense GEMM runs in fp32: alone, from a hot cache,
    # it leads from 16 rows, but inside a step it reads its 4-byte weights from memory, and 16 requests at once
    # decoded 112-116 tokens/s with 16 to 64 rows here against 97 with 8 (bench/llama_cpp.py's workload).
    MAX_ROWS = 4 if CPU_BF16 else 32

    def __init__(self, linear: nn.Linear, q: torch.Tensor, step: torch.Tensor, low: torch.Tensor):
        super().__init__()
        self.dense = linear
        self.register_buffer("weight_int4", torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1))
        self.register_buffer("scales_and_zeros", torch.stack([step.T, (low + 8 * step).T], -1).contiguous())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dense(x) if x.shape[0] > self.MAX_ROWS else self.forward_4bit(x)

    def forward_4bit(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.aten._weight_int4pack_mm_for_cpu(x, self.weight_int4, self.GROUP, self.scales_and_zeros)


def quantize_q4_1_(model: nn.Module, dtype: torch.dtype) -> nn.Module:
    """Keep every projection whose fp32 weight has Q4_1's form (q4_groups; every 4-bit projection of a GGUF, which
    the loader dequantized exactly) in 4 bits too, in place, and return model in dtype. The lm_head, which a decode
    step reads whole for every token, gets an int8 copy with one scale per row for a step of one request
    (Int8RowLinear): a GGUF holds it in Q8_0, 8 bits with a scale per 32, for which torch has no kernel, so this
    rounds it once more (perplexity in bench/quality.py). Other weights (the embedding, Q8_0 or F16 projections)
    stay dense."""
    for parent in list(model.modules()):
        for name, child in parent.named_children():
            if isinstance(child, nn.Linear) and (groups := q4_groups(child.weight)) is not None:
                setattr(parent, name, Q4GroupLinear(child, *groups))
    if isinstance(getattr(model, "lm_head", None), nn.Linear):
        model.lm_head = Int8RowLinear(model.lm_head)
    return model.to(dtype)


# LLM(quantization=...)'s values and what applies each to a model loaded in fp32, returning it in LLM's dtype.
# "int8_per_channel_weight_only" is vLLM 0.33's online shorthand, which vLLM applies to MoE layers only (its linear
# field is unset) and nanoengine, with no MoE, to every Linear. "q4_1" (llama.cpp's name for the format) has no
# counterpart in 0.33, which no longer loads GGUF files and whose 4-bit weight kernels are for GPUs.
QUANTIZATION_METHODS = {"q4_1": quantize_q4_1_, "int8_per_channel_weight_only": quantize_int8_weight_only_}


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # F.rms_norm normalizes a bf16 x in fp32 (the mean of squares loses too much otherwise) and rounds the
        # result to bf16 before the weight multiplies it, as Hugging Face's LlamaRMSNorm does. Given the weight, it
        # would multiply in fp32 first, one rounding fewer than Hugging Face.
        return self.weight * F.rms_norm(x, x.shape[-1:], eps=self.eps)


class RotaryEmbedding(nn.Module):
    """RoPE in the "rotate half" layout Hugging Face checkpoints use.

    Position enters attention only here, by rotating q and k. That is why a cached K block can be
    reused by any request with the same prefix: its tokens sit at the same positions.
    """

    def __init__(self, head_dim: int, base: float, max_positions: int):
        super().__init__()
        inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
        freqs = torch.outer(torch.arange(max_positions, dtype=torch.float32), inv_freq)
        cos, sin = freqs.cos(), freqs.sin()
        # Rows over the whole head_dim, laid out for apply_rotary's one multiply-add: cos twice, and sin with its
        # first half negated. Plain attributes, not buffers: model.to(bf16) must not round the angles.
        self.cos, self.sin = torch.cat((cos, cos), dim=-1), torch.cat((-sin, sin), dim=-1)

    def forward(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """positions [T] -> (cos, sin), each [T, 1, head_dim] as laid out in __init__. Every layer rotates by the
        same positions, so the model looks the rows up once per step (as Hugging Face's LlamaModel does)."""
        return self.cos[positions].unsqueeze(1), self.sin[positions].unsqueeze(1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [T, heads, head_dim] rotated by the (cos, sin) rows of its tokens' positions (RotaryEmbedding's layout).

    With x = (x1, x2) in halves this is (x1 * cos - x2 * sin, x2 * cos + x1 * sin), Hugging Face's rotate-half,
    to the bit in fp32 (adding a negated product is subtracting it); rolling x by half a head swaps its halves,
    so the step runs 5 ops a layer instead of 11. A bf16 x multiplies into fp32 by type promotion: no cast first."""
    out = x * cos + x.roll(x.shape[-1] // 2, dims=-1) * sin
    return out if out.dtype == x.dtype else out.to(x.dtype)


class LlamaAttention(nn.Module):
    def __init__(self, config: LlamaConfig, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        # Q, K and V in one matmul (vLLM's QKVParallelLinear): one pass over x instead of three.
        self.q_size, self.kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        self.qkv_proj = Linear(config.hidden_size, self.q_size + 2 * self.kv_size, bias=False)
        self.o_proj = Linear(self.q_size, config.hidden_size, bias=False)

    def forward(self, rope: tuple[torch.Tensor, torch.Tensor], x: torch.Tensor, attn: AttentionContext) -> torch.Tensor:
        t, qk_size = x.shape[0], self.q_size + self.kv_size
        qkv = self.qkv_proj(x)
        # Q's and K's heads rotate by the same rows: one pass over both halves the step's small ops.
        qk = apply_rotary(qkv[:, :qk_size].view(t, -1, self.head_dim), *rope)
        q, k = qk.split([self.num_heads, self.num_kv_heads], dim=1)
        o = attn(self.layer_idx, q, k, qkv[:, qk_size:].reshape(t, self.num_kv_heads, self.head_dim))
        return self.o_proj(o.reshape(t, self.q_size))


class LlamaMLP(nn.Module):
    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.intermediate_size = config.intermediate_size
        self.gate_up_proj = Linear(config.hidden_size, 2 * config.intermediate_size, bias=False)
        self.down_proj = Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).split(self.intermediate_size, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class LlamaDecoderLayer(nn.Module):
    def __init__(self, config: LlamaConfig, layer_idx: int):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = LlamaAttention(config, layer_idx)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = LlamaMLP(config)

    def forward(self, rope, x, attn):
        x = x + self.self_attn(rope, self.input_layernorm(x), attn)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaModel(nn.Module):
    def __init__(self, config: LlamaConfig):
        super().__init__()
        # Built without its random init, which loading or LlamaForCausalLM.random overwrites: under
        # from_state_dict's torch.device("meta") that init (like a RoPE table) imports torch._dynamo, 1.4 s of
        # every process's first LLM().
        self.embed_tokens = nn.Embedding(
            config.vocab_size, config.hidden_size, _weight=torch.empty(config.vocab_size, config.hidden_size)
        )
        # Built by LlamaForCausalLM._finish, in fp32 on the device the model runs on.
        self.rotary_emb: RotaryEmbedding | None = None
        self.layers = nn.ModuleList(LlamaDecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, input_ids, positions, attn):
        x = self.embed_tokens(input_ids)
        rope = self.rotary_emb(positions)
        for layer in self.layers:
            x = layer(rope, x, attn)
        return self.norm(x)


class LlamaForCausalLM(nn.Module):
    """forward(input_ids[T], positions[T], attn) -> hidden[T, H]; compute_logits(hidden) -> [T, V].

    Logits are a separate call so the engine projects only the one row per request it samples
    from, not all T rows (the vocabulary projection is the single largest matmul in SmolLM2).
    """

    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.config = config
        self.model = LlamaModel(config)
        self.lm_head = Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, attn: AttentionContext) -> torch.Tensor:
        return self.model(input_ids, positions, attn)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden).float()

    @classmethod
    def from_state_dict(cls, config: LlamaConfig, state_dict: dict, device="cpu", dtype=torch.float32):
        """Build from Hugging Face-named weights, without initializing random ones first (that alone
        would cost seconds)."""
        with torch.device("meta"):
            model = cls(config)
        model.load_state_dict(_merge_projections(state_dict, config), strict=False, assign=True)
        if config.tie_word_embeddings:
            model.lm_head.weight = model.model.embed_tokens.weight
        missing = [n for n, p in model.named_parameters() if p.is_meta]
        if missing:
            raise ValueError(f"checkpoint lacks weights for: {missing[:5]}")
        return model._finish(device, dtype)

    @classmethod
    def random(cls, config: LlamaConfig, seed: int = 0, device="cpu", dtype=torch.float32, std: float = 0.02):
        """Random weights, for tests and benchmarks that need no real model.

        The default std is a trained model's scale, at which a tiny random model mostly repeats its
        last input token; std=0.2 makes every greedy token depend on the whole context, so a test
        whose outputs must change when attention reads the wrong K/V can see it.
        """
        model = cls(config)
        fill_random_(model, seed, std)
        return model._finish(device, dtype)

    def _finish(self, device, dtype) -> LlamaForCausalLM:
        self.model.rotary_emb = finish_(self, device, dtype)
        return self


def fill_random_(module: nn.Module, seed: int, std: float) -> None:
    """Random weights for a module's own parameters, in place: norms near 1, the rest N(0, std^2)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(std * torch.randn(p.shape, generator=gen))


def finish_(module: nn.Module, device, dtype) -> RotaryEmbedding:
    """Move a model to device/dtype for inference and return its RoPE table, built there in fp32: bf16 angles
    drift at long positions."""
    module.to(device=device, dtype=dtype).eval().requires_grad_(False)
    c = module.config
    with torch.device(device):
        return RotaryEmbedding(c.head_dim, c.rope_theta, c.max_position_embeddings)


# Hugging Face keeps q/k/v and gate/up as separate weights; we stack them (vLLM: hf_to_vllm_mapper's
# orig_to_new_stacked, applied by AutoWeightsLoader).
_STACKED = {"self_attn.qkv_proj": ("q_proj", "k_proj", "v_proj"), "mlp.gate_up_proj": ("gate_proj", "up_proj")}


def _merge_projections(state_dict: dict, config: LlamaConfig) -> dict:
    out = {k: v for k, v in state_dict.items() if not (k == "lm_head.weight" and config.tie_word_embeddings)}
    for i in range(config.num_hidden_layers):
        for merged, parts in _STACKED.items():
            prefix = f"model.layers.{i}.{merged.split('.')[0]}."
            out[f"model.layers.{i}.{merged}.weight"] = torch.cat([out.pop(prefix + p + ".weight") for p in parts])
    return out
