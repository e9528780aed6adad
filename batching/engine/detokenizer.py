"""Incremental detokenisation: the text each new token adds, right across multi-byte characters."""

from __future__ import annotations

from collections.abc import Sequence

from tokenizers.decoders import DecodeStream
from transformers import PreTrainedTokenizerBase


def decode_text(tokenizer: PreTrainedTokenizerBase, ids: Sequence[int]) -> str:
    """The text of `ids` without special tokens (one sequence in, one string out)."""
    text = tokenizer.decode(list(ids), skip_special_tokens=True)
    return text if isinstance(text, str) else "".join(text)


class IncrementalDetokenizer:
    """Feed token ids one at a time; get back only the new text (empty while a character is incomplete).

    Fast tokenizers use the `tokenizers` library's own `DecodeStream`; others decode a short window.
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase, prompt_ids: list[int]) -> None:
        self.tokenizer = tokenizer
        backend = getattr(tokenizer, "backend_tokenizer", None)
        self._backend = backend
        if backend is not None:
            # Prefilling the stream with the prompt's tail keeps leading-space handling as in a full decode.
            self._stream = DecodeStream(ids=prompt_ids[-4:], skip_special_tokens=True)
        else:
            self._ids = list(prompt_ids[-4:])
            self._prefix_offset = 0
            self._read_offset = len(self._ids)

    def push(self, token_id: int) -> str:
        if self._backend is not None:
            return self._stream.step(self._backend, token_id) or ""
        self._ids.append(token_id)
        prefix = decode_text(self.tokenizer, self._ids[self._prefix_offset : self._read_offset])
        full = decode_text(self.tokenizer, self._ids[self._prefix_offset :])
        if len(full) > len(prefix) and not full.endswith("\ufffd"):
            self._prefix_offset = self._read_offset
            self._read_offset = len(self._ids)
            return full[len(prefix) :]
        return ""
