"""`python -m nanoengine generate|chat` prints text, TTFT and tokens/s."""

import subprocess
import sys

import pytest
import torch


def run(*args):
    return subprocess.run(
        [sys.executable, "-m", "nanoengine", *args], capture_output=True, text=True, timeout=120, check=False
    )


@pytest.mark.model
@pytest.mark.skipif(torch.cuda.is_available(), reason="golden text recorded on cpu/float32; the CLI runs bf16 on CUDA")
def test_chat_answers_with_timings():
    r = run("chat", "What is the capital of Japan?")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "The capital of Japan is Tokyo."
    assert "TTFT" in r.stderr and "tokens/s" in r.stderr


@pytest.mark.model
def test_generate_sampling_flags_and_seed_reproduce():
    args = (
        "generate",
        "--prompt",
        "Once upon a time",
        "--max-tokens",
        "8",
        "--temperature",
        "0.9",
        "--top-p",
        "0.9",
        "--seed",
        "3",
    )
    first, second = run(*args), run(*args)
    assert first.returncode == 0, first.stderr
    assert first.stdout == second.stdout and first.stdout.strip()
    assert "8 generated (length)" in first.stderr


def test_bad_input_exits_2_with_a_message():
    r = run("generate", "--prompt", "hi", "--max-tokens", "0")
    assert r.returncode == 2
    assert "max_tokens must be an integer >= 1" in r.stderr
