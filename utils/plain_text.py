"""User text shown as text: never markdown, links, icons or HTML, and isolated from the page's text direction."""

from __future__ import annotations

import html


def isolated_html(text: str) -> str:
    """`text` as an HTML fragment that shows exactly those characters: escaped (no tag, link or icon can come of
    it), line breaks kept, and inside `<bdi>` so a right-to-left override in it cannot reorder what surrounds it."""
    return f'<bdi style="white-space: pre-wrap">{html.escape(text, quote=True)}</bdi>'


def card_heading_html(number: int, prompt: str) -> str:
    """An answer card's heading: the request's number in bold, then its prompt as plain text."""
    return f'<div class="batchscope-card-heading"><strong>#{number}</strong> · {isolated_html(prompt)}</div>'
