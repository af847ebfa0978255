"""A library's error, quoted inside a sentence of ours."""

from __future__ import annotations


def first_line(error: BaseException) -> str:
    """The error's first non-empty line, without a final period (our sentence goes on after it), or
    its type's name when it says nothing. The first line is what went wrong; torch appends its
    dispatcher's tables after it, and parsers the text they choked on."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return lines[0].rstrip(". ") if lines else type(error).__name__
