"""Stop strings as the API applies them, on hand-made text: where an answer ends, and what a stream may send as the
pieces come (the server-side tests check the same on the real model's answers)."""

from __future__ import annotations

import pytest

from batching.serve.stops import StreamedText, cut, stop_at


@pytest.mark.parametrize(
    ("text", "stops", "end"),
    [
        ("Hello world", ["world"], 6),
        ("Hello world", ["xyz"], None),
        ("abc", ["bc", "ab"], 0),  # "ab" completes first, whatever the list order (vLLM's rule)
        ("xabcd", ["abcd", "bc"], 2),  # "bc" completes before "abcd", though "abcd" starts first
        ("abab", ["ab"], 0),  # the first occurrence
        ("a\n\nQ: next", ["\n\nQ:"], 1),
    ],
)
def test_an_answer_ends_before_the_stop_string_that_completes_first(text, stops, end) -> None:
    assert stop_at(text, stops) == end
    assert cut(text, stops) == ((text, False) if end is None else (text[:end], True))


def _stream(pieces: list[str], stops: list[str]) -> list[str]:
    text = StreamedText(stops)
    return [text.push(piece) for piece in pieces]


def test_a_stream_holds_back_only_what_could_still_become_a_stop_string() -> None:
    assert _stream(["Hello", " wo", "rld", "!"], ["world"]) == ["Hello", " ", "", ""]
    assert _stream(["Hello", " wa", "ter"], ["world"]) == ["Hello", " wa", "ter"]  # "w" held, then released
    assert _stream(["ab", "c"], ["abd", "bce"]) == ["", "a"]  # "ab" could begin "abd"; then "bc" could begin "bce"
    assert _stream(["one", "two"], []) == ["one", "two"]


def test_nothing_after_a_stop_string_is_sent_even_in_the_same_piece() -> None:
    assert _stream(["The end. Q: more", " and more"], [" Q:"]) == ["The end.", ""]


def test_the_rest_of_a_whole_answer_is_what_the_stream_has_not_sent() -> None:
    text = StreamedText(["STOP"])
    assert text.push("abc ST") == "abc "
    assert text.rest("abc ST\ufffd") == "ST\ufffd"  # the final decode's last character, and the tail held back
    assert text.rest("something else") == ""  # never resend or contradict what was sent
