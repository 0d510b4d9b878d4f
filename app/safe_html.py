"""One place that makes user-supplied text safe to show: column names, file names, stratum values,
run labels and error messages that quote them.

* :func:`html_text` — for anything that reaches HTML: deck.gl tooltips (rendered as ``innerHTML``),
  ``st.html`` legends, markdown with ``unsafe_allow_html``. ``<img src=x onerror=...>`` becomes text.
* :func:`md_text` — for Streamlit markdown (``st.markdown``, ``st.error``, ``st.caption``, ...): raw HTML
  is not rendered there, but links, images (``![](http://...)`` loads a remote URL), colour
  directives (``:red[...]``), code spans and LaTeX are; their markup characters are backslash-escaped
  so the text shows as typed.
* :func:`md_code` — the text as an inline code span, whatever backticks it holds.

No Streamlit here.
"""

from __future__ import annotations

import html
import re

_MD_SPECIAL = re.compile(r"([\\`*\[\]<>!$~|{}])")


def html_text(value) -> str:
    """``value`` as HTML text: ``& < > " '`` escaped, so it can never open a tag or an attribute."""
    return html.escape(str(value), quote=True)


def md_text(value) -> str:
    """``value`` as literal markdown text on one line (markup characters backslash-escaped)."""
    text = " ".join(str(value).splitlines())
    return _MD_SPECIAL.sub(r"\\\1", text)


def md_code(value) -> str:
    """``value`` as one inline code span (a fence longer than any backtick run inside)."""
    text = " ".join(str(value).splitlines())
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if text.startswith("`") or text.endswith("`") or not text.strip() else ""
    return f"{fence}{pad}{text}{pad}{fence}"
