"""Stop strings as OpenAI's API and vLLM's server apply them: the answer ends just before the stop string that
completes first, which is left out of the text and of the stream. A stream holds back the tail that could still
grow into a stop string until the next piece settles it (vLLM holds back the longest stop string less a character,
always; this holds back only what could be one)."""

from __future__ import annotations

from collections.abc import Sequence


def stop_at(text: str, stops: Sequence[str]) -> int | None:
    """Where the answer ends: the start of the stop string that completes first in `text` (ties: list order, as
    vLLM's `check_stop_strings`), or None when there is none."""
    best_end, best_start = None, None
    for stop in stops:
        start = text.find(stop)
        if start >= 0 and (best_end is None or start + len(stop) < best_end):
            best_end, best_start = start + len(stop), start
    return best_start


def cut(text: str, stops: Sequence[str]) -> tuple[str, bool]:
    """`text` without its stop string and all after it, and whether it had one."""
    end = stop_at(text, stops)
    return (text, False) if end is None else (text[:end], True)


def _open_tail(text: str, stops: Sequence[str]) -> int:
    """The length of the longest tail of `text` that begins some stop string (which the next piece may complete)."""
    longest = 0
    for stop in stops:
        for size in range(min(len(stop) - 1, len(text)), longest, -1):
            if text.endswith(stop[:size]):
                longest = size
                break
    return longest


class StreamedText:
    """An answer's text as a stream may send it: pieces in, the part no stop string can claim out."""

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = tuple(stops)
        self.text = ""  # every piece so far
        self.sent = 0  # characters of `text` sent
        self.stopped = False

    def push(self, piece: str) -> str:
        """Take the next piece of text; return what may be sent now (possibly empty)."""
        if self.stopped:
            return ""
        self.text += piece
        end = stop_at(self.text, self.stops) if self.stops else None
        if end is not None:
            self.stopped = True
            safe = end
        else:
            safe = len(self.text) - _open_tail(self.text, self.stops)
        if safe <= self.sent:
            return ""
        out, self.sent = self.text[self.sent : safe], safe
        return out

    def rest(self, final: str) -> str:
        """What is left to send once the answer is whole: `final` (already cut at its stop string) after what was
        sent (the engine's final decode may add a last character the pieces held back)."""
        sent = self.text[: self.sent]
        return final[len(sent) :] if final.startswith(sent) else ""
