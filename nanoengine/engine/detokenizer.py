"""Generated ids to text, one step at a time (vllm/v1/engine/detokenizer.py)."""

from __future__ import annotations

from tokenizers import decoders

from nanoengine.model.tokenizer import Tokenizer


class IncrementalDetokenizer:
    """The text of a request's generated ids, extended one token at a time.

    tokenizers' DecodeStream keeps only the few ids it needs for context, and the text is kept as a
    list of pieces, so a step costs the same at the 2,000th token as at the 10th; decoding the whole
    list again at every step made a generation O(n^2). A character whose UTF-8 bytes span several
    tokens appears once its last byte arrives.
    Invariant: `text == tokenizer.decode(ids[:num_tokens])` for the ids passed so far.
    """

    __slots__ = ("_pieces", "_stream", "_tok", "num_chars", "num_tokens")

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tok = tokenizer._tok
        self._stream = decoders.DecodeStream(skip_special_tokens=True)
        self._pieces: list[str] = []
        self.num_chars = 0
        self.num_tokens = 0

    def update(self, token_ids: list[int]) -> str:
        """Decode the ids past the ones already seen (token_ids only grows); return the new text."""
        return "".join([self.step(t) for t in token_ids[self.num_tokens :]])

    def step(self, token_id: int) -> str:
        """Decode one more id; return its text ("" while a character's bytes are still incomplete)."""
        new = self._stream.step(self._tok, token_id) or ""
        self.num_tokens += 1
        if new:
            self._pieces.append(new)
            self.num_chars += len(new)
        return new

    def tail(self, num_chars: int) -> str:
        """The last num_chars characters (fewer if the text is shorter), reading only the pieces needed."""
        pieces, size = [], 0
        for piece in reversed(self._pieces):
            if size >= num_chars:
                break
            pieces.append(piece)
            size += len(piece)
        return "".join(reversed(pieces))[-num_chars:] if num_chars else ""

    @property
    def text(self) -> str:
        if len(self._pieces) > 1:
            self._pieces = ["".join(self._pieces)]
        return self._pieces[0] if self._pieces else ""
