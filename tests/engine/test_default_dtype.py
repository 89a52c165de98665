"""The engine's dtype on each device (EngineArgs' default_dtype): fp32 on the CPU, bf16 on CUDA from compute
capability 8.0, fp16 below it (a T4 is 7.5 and has no bf16), as vLLM 0.33 falls back; and bf16 asked
for on such a GPU is refused naming `dtype`. The CUDA queries are faked, so this runs on a CPU."""

import pytest
import torch

from nanoengine import LLM
from nanoengine.engine import arg_utils
from nanoengine.errors import InvalidEngineArgumentError
from nanoengine.worker import worker as worker_module

CUDA = torch.device("cuda")


@pytest.fixture
def gpu(monkeypatch):
    """Makes this machine look like it has one CUDA GPU of the compute capability given."""

    def fake(capability):
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
        # What recent torch answers on a T4: bf16 "supported" through emulation. The engine must not ask it.
        monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)

    return fake


@pytest.mark.parametrize(
    "capability, expected",
    [
        ((7, 0), torch.float16),  # V100
        ((7, 5), torch.float16),  # T4, RTX 20xx
        ((8, 0), torch.bfloat16),  # A100
        ((8, 6), torch.bfloat16),  # RTX 30xx, A10
        ((9, 0), torch.bfloat16),  # H100
    ],
)
def test_cuda_default_is_bf16_from_ampere_and_fp16_before(gpu, capability, expected):
    gpu(capability)
    assert arg_utils.default_dtype(CUDA) is expected
    assert arg_utils.bf16_supported(CUDA) is (expected is torch.bfloat16)


def test_cpu_default_is_fp32():
    assert arg_utils.default_dtype(torch.device("cpu")) is torch.float32


@pytest.mark.parametrize("device", ["cuda", "auto", CUDA])
def test_bf16_on_a_turing_gpu_names_dtype_and_says_fp16(gpu, device):
    gpu((7, 5))
    with pytest.raises(InvalidEngineArgumentError, match=r"7\.5.*torch\.float16") as info:
        LLM(device=device, dtype=torch.bfloat16, progress=False)
    assert info.value.parameter == "dtype" and info.value.value is torch.bfloat16


def test_bf16_on_the_cpu_is_still_allowed():
    assert arg_utils.bf16_supported(torch.device("cpu"))


def test_the_engine_takes_its_default_from_default_dtype(gpu, monkeypatch):
    # A 7.5 GPU and dtype left out: the weights load in fp16. Loading stops at the weights (no GPU here).
    gpu((7, 5))
    asked = []

    def stop(folder, config, device, dtype, quantization):
        asked.append((device, dtype))
        raise RuntimeError("stop before the weights")

    monkeypatch.setattr(worker_module, "load_model", stop)
    with pytest.raises(RuntimeError, match="stop before"):
        LLM(device="cuda", progress=False)
    assert asked == [(CUDA, torch.float16)]
