"""Griffe extension for the API reference: the project's paper citations, `[q:<key>]`, shown as
code rather than read as Markdown links.

Docstrings cite what a paper says by a key of `fitting.paper_quotes.QUOTES`, written `[q:key]`.
In Markdown two such citations in a row (`[q:a] [q:b]`, or one per line) read as a reference link
whose target does not exist, which fails a strict build. This extension wraps each citation in a
code span before mkdocstrings renders the docstring; one already inside a code span is left as it
is. `mkdocs.yml` names it under the Python handler's `extensions`.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

# `[q:key]` not already in a code span (no backtick right before or after it).
CITATION = re.compile(r"(?<!`)\[(q:[A-Za-z0-9_.\-]+)\](?!`)")


def as_code(text: str) -> str:
    """`text` with every citation `[q:key]` outside code spans written as `` `[q:key]` ``."""
    return CITATION.sub(r"`[\1]`", text)


class Citations(griffe.Extension):
    """Rewrites the citations of every docstring (see the module docstring)."""

    def on_object(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        """Rewrites `obj`'s docstring, if it has one."""
        if obj.docstring is not None:
            obj.docstring.value = as_code(obj.docstring.value)
