"""An EAGLE draft head for a Llama target (vllm/model_executor/models/llama_eagle.py, EAGLE-1).

The head reads, at each position p, the target's hidden state at p together with the token at p + 1, mixes them
with one linear layer (fc, 2H -> H) and runs its own decoder layers over the result, the first without its input
norm; the target's lm_head turns the output into the next token's logits. Its output at p stands in for a hidden
state in the next draft pass. It shares the target's embedding and lm_head, as vLLM's head does when its
checkpoint has none.
"""

from __future__ import annotations

import torch
from torch import nn

from nanoengine.attention import AttentionContext
from nanoengine.config import LlamaConfig
from nanoengine.model.llama import Linear, LlamaDecoderLayer, LlamaForCausalLM, RotaryEmbedding, fill_random_, finish_


class EagleLlamaForCausalLM(nn.Module):
    """forward(input_ids[T], positions[T], hidden_states[T, H], attn) -> hidden[T, H]; compute_logits as the target's.

    config is the head's: the target's shape with num_hidden_layers = the head's layers (1 in EAGLE-1). Its
    parameters are fc and its layers; the target, whose embedding and lm_head it uses, is not one of its modules.
    """

    def __init__(self, target: LlamaForCausalLM, num_hidden_layers: int = 1):
        super().__init__()
        self.config = LlamaConfig.from_dict(target.config.to_dict() | {"num_hidden_layers": num_hidden_layers})
        object.__setattr__(self, "target", target)  # not a submodule: its weights stay the target's
        hidden = self.config.hidden_size
        self.fc = Linear(2 * hidden, hidden, bias=False)
        self.layers = nn.ModuleList(LlamaDecoderLayer(self.config, i) for i in range(num_hidden_layers))
        # EAGLE's first layer reads fc's output as it is (the reference cnets.py skips that norm; vLLM too).
        self.layers[0].input_layernorm = nn.Identity()
        self.rotary_emb: RotaryEmbedding | None = None

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, hidden_states: torch.Tensor, attn: AttentionContext
    ) -> torch.Tensor:
        x = self.fc(torch.cat((self.target.model.embed_tokens(input_ids), hidden_states), dim=-1))
        rope = self.rotary_emb(positions)
        for layer in self.layers:
            x = layer(rope, x, attn)
        return x

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.target.compute_logits(hidden)

    @classmethod
    def random(
        cls, target: LlamaForCausalLM, num_hidden_layers: int = 1, seed: int = 0, std: float = 0.02
    ) -> EagleLlamaForCausalLM:
        """A head with random weights, on the target's device and dtype. No trained EAGLE head exists for the
        embedded SmolLM2, so its drafts are almost always rejected: it exercises the mechanics, not the speed."""
        head = cls(target, num_hidden_layers)
        fill_random_(head, seed, std)
        weight = next(target.parameters())
        head.rotary_emb = finish_(head, weight.device, weight.dtype)
        return head
