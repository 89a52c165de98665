"""Write small llama GGUF files for tests, the way llama.cpp's converter lays them out, and read the Hugging Face
reference's greedy tokens on the same weights."""

from collections.abc import Callable
from pathlib import Path

import gguf
import numpy as np
import torch
from tokenizers import pre_tokenizers

from nanoengine.config import LlamaConfig

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = ["Ġ t", "h e", "Ġt he"]
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def tiny_vocab() -> list[str]:
    merged = ["".join(m.split(" ")) for m in MERGES]
    return SPECIALS + sorted(pre_tokenizers.ByteLevel.alphabet()) + merged


def hf_state_dict(model) -> dict:
    """Our model's weights under Hugging Face's names, with q/k/v and gate/up split apart again."""
    c = model.config
    q, kv = c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
    out = {}
    for name, w in model.state_dict().items():
        if "qkv_proj" in name:
            for part, piece in zip(("q_proj", "k_proj", "v_proj"), w.split([q, kv, kv])):
                out[name.replace("qkv_proj", part)] = piece
        elif "gate_up_proj" in name:
            for part, piece in zip(("gate_proj", "up_proj"), w.chunk(2)):
                out[name.replace("gate_up_proj", part)] = piece
        else:
            out[name] = w
    return out


def hf_greedy(hf, ids, n):
    """Greedy tokens from full forward passes: no cache on the reference side at all."""
    ids = list(ids)
    with torch.no_grad():
        for _ in range(n):
            ids.append(int(hf(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[-n:]


def _permute(w: np.ndarray, n_heads: int) -> np.ndarray:
    """HF -> llama.cpp row order for Q and K (the inverse of what the loader undoes)."""
    return w.reshape(n_heads, 2, w.shape[0] // n_heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_tiny_llama_gguf(
    path: Path,
    config: LlamaConfig,
    state_dict: dict,
    arch: str = "llama",
    extra_metadata: Callable[[gguf.GGUFWriter], None] | None = None,
) -> Path:
    """config's sliding window and layer types go in as llama.cpp's converter writes them; extra_metadata(writer)
    adds keys LlamaConfig itself would refuse, such as a window of 0."""
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(config.num_hidden_layers)
    w.add_context_length(config.max_position_embeddings)
    w.add_embedding_length(config.hidden_size)
    w.add_feed_forward_length(config.intermediate_size)
    w.add_head_count(config.num_attention_heads)
    w.add_head_count_kv(config.num_key_value_heads)
    w.add_rope_freq_base(config.rope_theta)
    w.add_layer_norm_rms_eps(config.rms_norm_eps)
    w.add_vocab_size(config.vocab_size)
    if config.sliding_window is not None:
        w.add_sliding_window(config.sliding_window)
    if config.layer_types is not None:
        w.add_sliding_window_pattern([t == "sliding_attention" for t in config.layer_types])
    tokens = tiny_vocab()
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_types([3 if t in SPECIALS else 1 for t in tokens])
    w.add_token_merges(MERGES)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(False)
    w.add_chat_template(CHAT_TEMPLATE)
    if extra_metadata is not None:
        extra_metadata(w)
    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight"}
    layer = {
        "input_layernorm": "attn_norm",
        "post_attention_layernorm": "ffn_norm",
        "self_attn.q_proj": "attn_q",
        "self_attn.k_proj": "attn_k",
        "self_attn.v_proj": "attn_v",
        "self_attn.o_proj": "attn_output",
        "mlp.gate_proj": "ffn_gate",
        "mlp.up_proj": "ffn_up",
        "mlp.down_proj": "ffn_down",
    }
    for name, tensor in state_dict.items():
        if name == "lm_head.weight" and config.tie_word_embeddings:
            continue
        a = tensor.detach().float().numpy().copy()
        if name.startswith("model.layers."):
            _, _, idx, rest = name.split(".", 3)
            module, suffix = rest.rsplit(".", 1)
            if module == "self_attn.q_proj":
                a = _permute(a, config.num_attention_heads)
            elif module == "self_attn.k_proj":
                a = _permute(a, config.num_key_value_heads)
            gname = f"blk.{idx}.{layer[module]}.{suffix}"
        else:
            gname = names.get(name, "output.weight")
        w.add_tensor(gname, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
