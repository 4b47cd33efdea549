"""Text from the ledger, shown as written: never as markdown.

Contract: `plain(value)` is `str(value)` with every ASCII punctuation character backslash-escaped, which
CommonMark (Streamlit's markdown) reads back as the character itself. Whatever a model wrote into a reply or a
tool call, an environment into an error, or a link into a query parameter, passed through `plain` before it
reaches `st.markdown`, `st.caption`, `st.error` or another markdown element, shows as its text: no image
(which the browser would fetch from a server the model names), link, HTML, code span, math or colour
directive. Token text and tracebacks go to `st.html` (escaped) and `st.code`, which are never markdown.
"""

from __future__ import annotations

import re

__all__ = ["plain"]

_PUNCTUATION = re.compile(r"([!-/:-@\[-`{-~])")


def plain(value: object) -> str:
    return _PUNCTUATION.sub(r"\\\1", str(value))
