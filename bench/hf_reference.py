"""Hugging Face's own load of a GGUF: the reference that the tests and `bench/engine.py` compare nanoengine with.

transformers dequantizes a GGUF in about 15 s on a 2-core CPU (it parses the file tensor by tensor, twice). Its
result is kept in nanoengine's cache folder as HF's own files, written from HF's model by HF's serializers, so that
every later load is transformers reading safetensors (about a second). nanoengine's loader takes no part in it, so
the reference stays independent of the code it checks. The copy is keyed by the GGUF's sha256 and the transformers
version: another file, or another release of transformers' GGUF converter, makes a new one.
"""

import os
import shutil
import tempfile
from pathlib import Path

import torch

from nanoengine.model.loader import cache_root, file_sha256


def reference_folder(gguf: Path) -> Path:
    """HF's model and tokenizer for `gguf`, converted by transformers on first use."""
    import transformers

    folder = cache_root() / "hf-reference" / f"{file_sha256(gguf)}-transformers-{transformers.__version__}"
    if not (folder / "config.json").exists():
        _convert(gguf, folder)
    return folder


def _convert(gguf: Path, folder: Path) -> None:
    import transformers
    from safetensors.torch import save_model

    model = transformers.LlamaForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    tokenizer = transformers.AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=folder.parent))
    # save_pretrained refuses a model loaded from a GGUF; save_model writes the same file (tied weights once).
    save_model(model, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    tokenizer.save_pretrained(tmp)
    model.config.to_json_file(tmp / "config.json")  # last: its presence marks a complete folder
    try:
        os.rename(tmp, folder)
    except OSError:  # another process (an xdist worker) finished first: its copy is the same
        shutil.rmtree(tmp)


def hf_model(gguf: Path, dtype: torch.dtype = torch.float32):
    """transformers' LlamaForCausalLM with the GGUF's weights, in eval mode."""
    import transformers

    return transformers.LlamaForCausalLM.from_pretrained(reference_folder(gguf), dtype=dtype).eval()


def hf_tokenizer(gguf: Path):
    import transformers

    return transformers.AutoTokenizer.from_pretrained(reference_folder(gguf))
