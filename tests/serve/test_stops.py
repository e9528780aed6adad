"""Stop strings as the API applies them, on hand-made text: where an answer ends, and what a stream may send as the
pieces come (the server-side tests check the same on the real model's answers)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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


def _whole_text_stream(pieces: list[str], stops: list[str]) -> list[str]:
    """What a stream may send, worked out from the whole text after every piece (slow, obviously right)."""
    text, sent, out = "", 0, []
    for piece in pieces:
        if sent < 0:
            out.append("")
            continue
        text += piece
        end = stop_at(text, stops)
        if end is None:
            tails = [n for stop in stops for n in range(1, len(stop)) if text.endswith(stop[:n])]
            end = len(text) - max(tails, default=0)
        out.append(text[sent:end] if end > sent else "")
        sent = -1 if stop_at(text, stops) is not None else max(sent, end)
    return out


@settings(max_examples=400, deadline=None)
@given(
    st.lists(st.text("ab c", max_size=6), max_size=12),
    st.lists(st.text("ab c", min_size=1, max_size=5), max_size=4),
)
def test_a_stream_matched_piece_by_piece_sends_what_the_whole_text_allows(pieces, stops) -> None:
    assert _stream(pieces, stops) == _whole_text_stream(pieces, stops)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text("ab", max_size=8), max_size=20), st.lists(st.text("ab", min_size=1, max_size=6), max_size=3))
def test_a_stream_keeps_only_a_tail_shorter_than_its_longest_stop_string(pieces, stops) -> None:
    text = StreamedText(stops)
    for piece in pieces:
        text.push(piece)
        assert len(text.held) < max((len(stop) for stop in stops), default=1)
