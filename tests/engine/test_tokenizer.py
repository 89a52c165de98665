"""Our tokenizer, rebuilt from GGUF metadata, must encode exactly as HF transformers' from the same file."""

import pytest

pytestmark = [pytest.mark.model, pytest.mark.reference]

TEXTS = [
    "Hello, world!",
    "The year 2024 had 366 days; π ≈ 3.14159.",
    "héllo wörld — naïve café, 日本語のテキスト, 한국어, Ελληνικά, emoji 😀👍🏽",
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    "   leading spaces,\ttabs\t\tand   runs   of  whitespace\n\n\n\r\n  trailing   ",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|>special<|im_end|>tokens<|im_start|>glued",
    'x = {\'key\': [1, 2, 3], "s": None}  # comment\nprint(f"{x!r:>10}")',
    "I'm sure they'll've done it; we're ABLE. CAPS and MiXeD case.",
    "",
    "\n",
    "a" * 300,
]


@pytest.mark.parametrize("text", TEXTS)
def test_encoding_equals_hf(llm, hf_tokenizer, text):
    assert llm.tokenizer.encode(text) == hf_tokenizer.encode(text, add_special_tokens=False)


@pytest.mark.parametrize("text", TEXTS)
def test_decode_round_trips(llm, text):
    assert llm.tokenizer.decode(llm.tokenizer.encode(text), skip_special_tokens=False) == text


def test_special_tokens_and_bos(llm):
    tok = llm.tokenizer
    assert tok.encode("<|im_start|><|im_end|>") == [1, 2]
    assert (tok.bos_token_id, tok.eos_token_id, tok.add_bos_token) == (1, 2, False)
    assert tok.vocab_size == 49152
    assert tok.encode("12345") == [33, 34, 35, 36, 37]  # the smollm pre-tokenizer: one token per digit


def test_chat_template_equals_hf(llm, hf_tokenizer):
    for messages in (
        [{"role": "user", "content": "What is the capital of Japan?"}],
        [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello."},
            {"role": "user", "content": "Bye"},
        ],
    ):
        ours = llm.tokenizer.apply_chat_template(messages)
        assert ours == hf_tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        assert ours.endswith("<|im_start|>assistant\n")


@pytest.mark.parametrize("text", TEXTS)
def test_incremental_detokenizer_equals_a_full_decode_at_every_complete_character(llm, text):
    from nanoengine.engine.detokenizer import IncrementalDetokenizer

    ids = llm.tokenizer.encode(text * 3)
    detokenizer = IncrementalDetokenizer(llm.tokenizer)
    for n in range(1, len(ids) + 1):
        full = llm.tokenizer.decode(ids[:n])
        detokenizer.update(ids[:n])
        streamed = detokenizer.text
        # A prefix that ends inside a multi-byte character decodes to U+FFFD; the stream waits instead.
        assert streamed == full or (full.endswith("\ufffd") and full.startswith(streamed))
    assert detokenizer.text == llm.tokenizer.decode(ids)


def test_incremental_detokenizer_tail_reads_the_last_characters(llm):
    from nanoengine.engine.detokenizer import IncrementalDetokenizer

    ids = llm.tokenizer.encode(TEXTS[2] * 2)
    detokenizer = IncrementalDetokenizer(llm.tokenizer)
    for n in range(1, len(ids) + 1):
        detokenizer.update(ids[:n])
    text = detokenizer.text
    assert detokenizer.num_chars == len(text)
    assert [detokenizer.tail(k) for k in (0, 1, 7, 500)] == ["", text[-1:], text[-7:], text]
