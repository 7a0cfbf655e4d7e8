"""Plain text made inert in Markdown, for every Markdown file the tool writes (the report, the
reporting card)."""

from __future__ import annotations

import re

_MD_SPECIAL = re.compile(r"([\\`*_\[\]|~#!])")
_MD_LINE_START = re.compile(r"^(\s*)([-+=]+|\d+[.)])(?=\s|$)", re.MULTILINE)


def md_escape(text) -> str:
    """Plain text made inert in Markdown: every character with a Markdown meaning is
    backslash-escaped, ``&``, ``<`` and ``>`` become HTML entities (so a label holding
    ``<script>`` or ``*x*|y`` shows as typed and cannot open a tag, an emphasis or a table
    cell), and a line start that would open a list or a heading is escaped.

    Every string of the report is plain text (readings, titles, labels from the user's data);
    the Markdown itself (headings, emphasis, tables) is added around the escaped text here.
    """
    s = str(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    s = _MD_SPECIAL.sub(r"\\\1", s)
    # a list, rule or underline start gets a backslash before its last mark: "\- x", "3\. x", "--\-"
    return _MD_LINE_START.sub(lambda m: m.group(1) + m.group(2)[:-1] + "\\" + m.group(2)[-1], s)
