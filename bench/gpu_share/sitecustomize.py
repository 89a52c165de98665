"""One notebook's share of a GPU that several notebooks use at once (bench/notebooks_cuda.py).

On CUDA, `LLM()` sizes its KV pool from gpu_memory_utilization of the memory the device reports free
(vLLM takes that share of the GPU's total memory instead, and refuses to start if less is free), so the
first of several notebooks run side by side would take nearly all of it. Each process started with this
folder on PYTHONPATH sees only NANOENGINE_GPU_SHARE of the card, as if alone on a smaller one: a T4's 15 GB
is about an eighth of an H200.
"""

import os

_SHARE = float(os.environ.get("NANOENGINE_GPU_SHARE", "1"))

if _SHARE < 1:
    import torch

    _device_mem_get_info = torch.cuda.mem_get_info

    def _mem_get_info(device=None):
        free, total = _device_mem_get_info(device)
        mine = int(total * _SHARE)
        return max(0, min(free, mine - torch.cuda.memory_reserved(device))), mine

    torch.cuda.mem_get_info = _mem_get_info
