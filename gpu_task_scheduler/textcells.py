"""A value written as plain text in a LaTeX or a Markdown table's cell (``gts results --format
latex|markdown``): nothing in it is read as markup."""

from __future__ import annotations

import html
import re

_LATEX_SPECIAL = {
    "\\": r"\textbackslash{}",
    "&": r"\&",
    "%": r"\%",
    "$": r"\$",
    "#": r"\#",
    "_": r"\_",
    "{": r"\{",
    "}": r"\}",
    "~": r"\textasciitilde{}",
    "^": r"\textasciicircum{}",
}
_LATEX_PATTERN = re.compile("|".join(re.escape(key) for key in _LATEX_SPECIAL))


def latex_text(value: str) -> str:
    r"""``value`` as plain text in LaTeX.

    >>> print(latex_text("a_1 & 50% {x}"))
    a\_1 \& 50\% \{x\}
    """
    return _LATEX_PATTERN.sub(lambda match: _LATEX_SPECIAL[match.group()], value)


# What Markdown would read as markup in a table's cell: a backslash (``\|`` would end the cell),
# the cell's bar, emphasis, code and links; and raw HTML, whose < > & become entities.
_MARKDOWN_SPECIAL = re.compile(r"([\\`*_\[\]|])")


def markdown_text(value: str) -> str:
    r"""``value`` as plain text in a Markdown table's cell.

    >>> print(markdown_text(r"a\|b <i>x</i> *c*"))
    a\\\|b &lt;i&gt;x&lt;/i&gt; \*c\*
    """
    return _MARKDOWN_SPECIAL.sub(r"\\\1", html.escape(value, quote=False))
