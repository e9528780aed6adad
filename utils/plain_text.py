"""User text shown as text: never markdown, links, icons or HTML, and isolated from the page's text direction."""

from __future__ import annotations

import html
import re

_MARKDOWN_SPECIAL = re.compile(r"([\\`*_{}\[\]()<>#+\-.!|~$:=^&])")


def escape_markdown(text: str) -> str:
    """Show user text literally inside st.markdown: every markdown character escaped, newlines kept."""
    return _MARKDOWN_SPECIAL.sub(r"\\\1", text).replace("\n", "  \n")


def isolated_html(text: str) -> str:
    """`text` as an HTML fragment that shows exactly those characters: escaped (no tag, link or icon can come of
    it), line breaks kept, and inside `<bdi>` so a right-to-left override in it cannot reorder what surrounds it."""
    return f'<bdi style="white-space: pre-wrap">{html.escape(text, quote=True)}</bdi>'


def card_heading_html(number: int, prompt: str) -> str:
    """An answer card's heading: the request's number in bold, then its prompt as plain text."""
    return f'<div class="batchscope-card-heading"><strong>#{number}</strong> · {isolated_html(prompt)}</div>'
