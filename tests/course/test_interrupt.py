"""The course's interrupt timer (chapter 00) against the engine: a KeyboardInterrupt mid-generate aborts the
call's requests and leaves the LLM as it was."""

import time

import pytest

from nanocourse.interrupt import keyboard_interrupt_after
from nanoengine import LLM, SamplingParams
from tests.engine.test_robustness import PROMPTS, assert_clean, tiny, tokens


class _SlowSteps:
    """An observer that makes each step last at least 10 ms, so a generation outlasts the timer however fast
    the machine is."""

    def on_schedule(self, *args) -> None:
        pass

    def on_step(self, *args) -> None:
        time.sleep(0.01)


def test_a_keyboard_interrupt_from_a_timer_mid_generate():
    """As Jupyter's 'interrupt the kernel': SIGINT lands wherever the main thread is."""
    llm = LLM(tiny(max_position_embeddings=2048), block_size=4, kv_cache_memory_bytes=2**22, progress=False)
    long = SamplingParams(temperature=0, max_tokens=1500, ignore_eos=True)  # 1,500 steps: at least 15 s
    expected = tokens(llm)
    llm.engine.observers.append(_SlowSteps())
    with pytest.raises(KeyboardInterrupt) as info, keyboard_interrupt_after(0.3):
        llm.generate(prompt_token_ids=PROMPTS, sampling_params=long)
    llm.engine.observers.clear()
    assert "were aborted" in "\n".join(info.value.__notes__)
    assert_clean(llm)
    assert llm.get_stats().num_aborted_requests == len(PROMPTS)
    assert tokens(llm) == expected
