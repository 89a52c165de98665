"""vLLM 0.33.0's wheel: fetched once from PyPI with `pip download --no-deps` into the course's cache, then read as
a zip. Nothing of vLLM is installed; only the Python files the graduation run loads are ever read from it.

Invariant: a wheel is used only when its sha256 is the one pinned here, so every run compares against the same
vLLM files (a different wheel under the same name raises WheelError rather than comparing against other code).
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import zipfile
from pathlib import Path

from nanoengine.model.loader import cache_root

VLLM_VERSION = "0.33.0"
WHEEL_NAME = f"vllm-{VLLM_VERSION}-cp38-abi3-manylinux_2_28_x86_64.whl"
WHEEL_SHA256 = "4b6bdec4ab269990bf70d45a3c1e94c3760a27064513760193b26d6f0da883aa"
WHEEL_MB = 336


class WheelError(RuntimeError):
    """vLLM's wheel could not be had (no network and no cached copy) or is not the pinned one."""


def wheel_dir() -> Path:
    """Where the wheel is kept: the course's cache ($NANOENGINE_CACHE, else ~/.cache/nanoengine), vllm-wheel/."""
    return cache_root() / "vllm-wheel"


def file_sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def fetch_wheel(folder: Path | None = None, announce=print) -> Path:
    """The wheel's path, downloading it into `folder` (default wheel_dir()) the first time with pip's own progress
    bar. Offline with no cached copy: WheelError saying so, and nothing is left behind (pip writes the wheel only
    once it has all of it)."""
    folder = wheel_dir() if folder is None else folder
    path = folder / WHEEL_NAME
    if not path.is_file():
        announce(
            f"Downloading vLLM {VLLM_VERSION}'s wheel ({WHEEL_MB} MB, once) into {folder} with "
            f"`pip download vllm=={VLLM_VERSION} --no-deps`; only its Python files are read, nothing is installed."
        )
        # The folders this call creates (the cache itself too, on a first run), innermost first: removed on failure.
        created = [p for p in (folder, *folder.parents) if not p.exists()]
        folder.mkdir(parents=True, exist_ok=True)
        command = [
            sys.executable,
            "-m",
            "pip",
            "download",
            f"vllm=={VLLM_VERSION}",
            "--no-deps",
            # The one wheel vLLM publishes (Linux x86-64): only its Python files are read, so any machine takes it.
            "--platform",
            "manylinux_2_28_x86_64",
            "--only-binary",
            ":all:",
            "--disable-pip-version-check",
            "--retries",
            "1",
            "--timeout",
            "15",
            "-d",
            str(folder),
        ]
        # pip's own progress bar shows on the terminal; its last lines say why, when it fails.
        if subprocess.run(command, check=False).returncode != 0 or not path.is_file():
            path.unlink(missing_ok=True)
            for made in created:
                if any(made.iterdir()):
                    break
                made.rmdir()
            raise WheelError(
                f"could not download vLLM {VLLM_VERSION}'s wheel (is the network reachable? pip's message is "
                f"above; in a notebook, in the terminal running Jupyter). Nothing was changed. Run again with a connection, or put {WHEEL_NAME} in {folder}."
            )
    digest = file_sha256(path)
    if digest != WHEEL_SHA256:
        raise WheelError(
            f"{path} has sha256 {digest}, not vLLM {VLLM_VERSION}'s {WHEEL_SHA256}: delete it and run again"
        )
    return path


def read_sources(wheel: Path, modules: list[str]) -> dict[str, tuple[str, bytes]]:
    """{module: (path in the wheel, its bytes)} for dotted module names (a package's name reads its __init__.py)."""
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        found = {}
        for module in modules:
            base = module.replace(".", "/")
            path = f"{base}.py" if f"{base}.py" in names else f"{base}/__init__.py"
            found[module] = (path, z.read(path))
        return found
