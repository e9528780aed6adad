"""User text as text: in HTML exactly its characters, no element of its own, its direction isolated; in markdown
every markup character escaped."""

from __future__ import annotations

from html.parser import HTMLParser

import pytest

from utils.plain_text import card_heading_html, escape_markdown, isolated_html


class Parsed(HTMLParser):
    """The tags and the text a browser would build from a fragment."""

    def __init__(self, fragment: str) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[str] = []
        self.text = ""
        self.feed(fragment)
        self.close()

    def handle_starttag(self, tag: str, attrs: list) -> None:
        self.tags.append(tag)

    def handle_data(self, data: str) -> None:
        self.text += data


@pytest.mark.parametrize(
    "prompt",
    [
        "<script>alert(1)</script><img src=x onerror=alert(2)>",
        "a \"quoted\" & 'single' <b>bold</b>",
        "www.example.com https://example.org bob@example.com :material/home: **not bold** [x](y)",
        "right-to-left \u202eoverride and \u2067isolate",
        "two\nlines",
    ],
)
def test_a_prompt_becomes_exactly_its_text_inside_one_bdi(prompt: str) -> None:
    parsed = Parsed(isolated_html(prompt))
    assert parsed.tags == ["bdi"]
    assert parsed.text == prompt


def test_a_card_heading_is_the_number_in_bold_then_the_prompt_as_text() -> None:
    parsed = Parsed(card_heading_html(7, "<i>hi</i> www.example.com"))
    assert parsed.tags == ["div", "strong", "bdi"]
    assert parsed.text == "#7 · <i>hi</i> www.example.com"


def test_escaped_markdown_has_no_markup_left() -> None:
    escaped = escape_markdown("**bold** _it_ [link](http://x) <b>tag</b> # head `code`")
    for special in "*_[]()<>#`":
        assert all(escaped[i - 1] == "\\" for i, char in enumerate(escaped) if char == special)
