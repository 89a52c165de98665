"""The Llama model: RMSNorm, RoPE, GQA attention, SwiGLU MLP, tied embeddings."""

from nanoengine.model.llama import LlamaForCausalLM

__all__ = ["LlamaForCausalLM"]
