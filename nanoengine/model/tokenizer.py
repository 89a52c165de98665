"""Tokenizer and chat template, rebuilt from a GGUF's metadata.

The GGUF stores a byte-level BPE as three arrays (tokens, merges, token types) plus the name of the
pre-tokenizer its vocabulary was trained with. We hand those to the `tokenizers` library, which owns
the BPE algorithm, and render the chat template (a Jinja string in the metadata) with jinja2.
"""

from __future__ import annotations

import json
from pathlib import Path

from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer

from nanoengine.errors import UnsupportedModelError

_CONTROL = 3  # llama.cpp's token type for special tokens such as <|im_start|>

# Llama-3-style split; the plain byte-level regex (GPT-2's) is the fallback for unknown names.
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def _pre_tokenizer(name: str | None):
    """llama.cpp's pre-tokenizer names -> `tokenizers` pre-tokenizers.

    "smollm" is GPT-2's split with every digit on its own, so "2024" costs four tokens.
    """
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if name == "smollm":
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    if name in ("llama-bpe", "llama3", "llama-v3"):
        return pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(_LLAMA3_SPLIT), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    return byte_level


def build_tokenizer_files(reader, folder: Path) -> None:
    """Write tokenizer.json and tokenizer_config.json for the GGUF `reader` into `folder`."""
    fields = reader.fields

    def get(key, default=None):
        return fields[key].contents() if key in fields else default

    if get("tokenizer.ggml.model") != "gpt2":
        raise UnsupportedModelError(
            f"The GGUF's tokenizer is {get('tokenizer.ggml.model')!r}; nanoengine builds byte-level "
            "BPE ('gpt2') tokenizers, as SmolLM and Llama 3 use. Choose a GGUF with a BPE tokenizer."
        )
    tokens = get("tokenizer.ggml.tokens")
    vocab = {tok: i for i, tok in enumerate(tokens)}
    merges = [tuple(m.split(" ", 1)) for m in get("tokenizer.ggml.merges")]
    tok = HFTokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False))
    tok.pre_tokenizer = _pre_tokenizer(get("tokenizer.ggml.pre"))
    tok.decoder = decoders.ByteLevel()
    types = get("tokenizer.ggml.token_type") or []
    tok.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t, ty in zip(tokens, types) if ty == _CONTROL]
    )
    tok.save(str(folder / "tokenizer.json"))

    bos, eos = get("tokenizer.ggml.bos_token_id"), get("tokenizer.ggml.eos_token_id")
    config = {
        "chat_template": get("tokenizer.chat_template"),
        "bos_token_id": bos,
        "eos_token_id": eos,
        "bos_token": tokens[bos] if bos is not None else None,
        "eos_token": tokens[eos] if eos is not None else None,
        "add_bos_token": bool(get("tokenizer.ggml.add_bos_token", False)),
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2))


class Tokenizer:
    """Encode, decode and apply the chat template.

    `encode` never inserts BOS unless the model's GGUF asks for it (SmolLM2's says add_bos=False);
    special tokens written in the text, like <|im_start|>, become their single ids.
    """

    def __init__(self, folder: Path):
        self._tok = HFTokenizer.from_file(str(folder / "tokenizer.json"))
        cfg = json.loads((folder / "tokenizer_config.json").read_text())
        self.bos_token_id: int | None = cfg["bos_token_id"]
        self.eos_token_id: int | None = cfg["eos_token_id"]
        self.bos_token: str | None = cfg["bos_token"]
        self.eos_token: str | None = cfg["eos_token"]
        self.add_bos_token: bool = cfg["add_bos_token"]
        self.chat_template: str | None = cfg["chat_template"]
        self._template = None

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size()

    def encode(self, text: str) -> list[int]:
        ids = self._tok.encode(text, add_special_tokens=False).ids
        if self.add_bos_token and self.bos_token_id is not None:
            ids = [self.bos_token_id, *ids]
        return ids

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def id_to_token(self, token_id: int) -> str | None:
        return self._tok.id_to_token(token_id)

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        """Render `messages` ([{"role": ..., "content": ...}]) with the model's own template."""
        if self.chat_template is None:
            raise UnsupportedModelError("This model's GGUF has no chat template; use generate() with plain text.")
        if self._template is None:
            env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
            env.globals["raise_exception"] = _raise_template_error
            self._template = env.from_string(self.chat_template)
        return self._template.render(
            messages=messages,
            add_generation_prompt=add_generation_prompt,
            bos_token=self.bos_token or "",
            eos_token=self.eos_token or "",
        )


def _raise_template_error(message: str):
    raise ValueError(f"chat template: {message}")
