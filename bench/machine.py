"""The machine a benchmark ran on, recorded under "machine" in every JSON that bench/ writes: a ratio against a
baseline moves with the CPU, so it is quoted with the CPU it came from."""

from __future__ import annotations

import os
import platform

import torch

VECTOR_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_tile", "amx_bf16", "asimd", "sve")


def machine_info() -> dict:
    """The CPU's model, cores and vector extensions, which decide the GEMM kernels oneDNN and MKL pick (an
    AVX2-only core gains nothing from packed weights), and the platform and Python."""
    cpu, flags = platform.processor() or platform.machine(), set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name":
                    cpu = value.strip()
                elif key.strip() in ("flags", "Features") and not flags:
                    flags = set(value.split())
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cpu_count": os.cpu_count(),
        "vector_extensions": [f for f in VECTOR_FLAGS if f in flags],
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "platform": platform.platform(),
        "python": platform.python_version(),
    }
