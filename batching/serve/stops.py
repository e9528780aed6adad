"""Stop strings as OpenAI's API and vLLM's server apply them: the answer ends just before the stop string that
completes first, which is left out of the text and of the stream. A stream holds back the tail that could still
grow into a stop string until the next piece settles it (vLLM holds back the longest stop string less a character,
always; this holds back only what could be one).

A stream's matching is incremental: each stop string keeps how much of it the text so far ends with (Knuth, Morris
and Pratt's automaton), so a new piece costs its own characters times the stop strings, whatever came before it.
How many stop strings a request may carry, and how long, is bounded (`MAX_STOP_STRINGS`, `MAX_STOP_CHARS`).
"""

from __future__ import annotations

from collections.abc import Sequence

# OpenAI allows 4 stop strings; vLLM sets no bound. These keep a request's matching to microseconds a token.
MAX_STOP_STRINGS = 64
MAX_STOP_CHARS = 512


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


class _StopMatcher:
    """One stop string, and how many of its first characters the text so far ends with."""

    __slots__ = ("fail", "matched", "stop")

    def __init__(self, stop: str) -> None:
        self.stop = stop
        self.matched = 0
        # fail[i]: the longest proper prefix of stop[: i + 1] that is also a suffix of it
        self.fail = [0] * len(stop)
        k = 0
        for i in range(1, len(stop)):
            while k and stop[i] != stop[k]:
                k = self.fail[k - 1]
            if stop[i] == stop[k]:
                k += 1
            self.fail[i] = k

    def feed(self, char: str) -> bool:
        """Take the text's next character; True when it completes the stop string."""
        stop, k = self.stop, self.matched
        while k and stop[k] != char:
            k = self.fail[k - 1]
        if stop[k] == char:
            k += 1
        if k == len(stop):
            self.matched = self.fail[k - 1]
            return True
        self.matched = k
        return False


class StreamedText:
    """An answer's text as a stream may send it: pieces in, the part no stop string can claim out. It keeps only
    what it sent and the tail it holds back."""

    def __init__(self, stops: Sequence[str]) -> None:
        self.matchers = [_StopMatcher(stop) for stop in stops]
        self.sent: list[str] = []
        self.held = ""  # received, not sent: the longest tail that begins a stop string
        self.stopped = False

    def push(self, piece: str) -> str:
        """Take the next piece of text; return what may be sent now (possibly empty)."""
        if self.stopped:
            return ""
        for index, char in enumerate(piece):
            for matcher in self.matchers:  # list order: of stop strings completing at one character, the first
                if matcher.feed(char):
                    self.stopped = True
                    text = self.held + piece[: index + 1]
                    self.held = ""
                    return self._send(text[: len(text) - len(matcher.stop)])
        text = self.held + piece
        keep = max((matcher.matched for matcher in self.matchers), default=0)
        self.held = text[len(text) - keep :] if keep else ""
        return self._send(text[: len(text) - keep])

    def _send(self, out: str) -> str:
        if out:
            self.sent.append(out)
        return out

    def rest(self, final: str) -> str:
        """What is left to send once the answer is whole: `final` (already cut at its stop string) after what was
        sent (the engine's final decode may add a last character the pieces held back)."""
        sent = "".join(self.sent)
        return final[len(sent) :] if final.startswith(sent) else ""
