"""Which fields of a CSV file count as missing.

pandas reads ``NA``, ``None``, ``null``, ``N/A``, ``nan`` and a dozen other spellings as missing
in every column. In a numeric column that is what they mean. In a categorical column they are
as likely to be categories -- ``None`` of a smoker column, ``NA`` (North America) of a region --
and reading them as missing refused the whole file, a schema file listing them included. So a
text column's field is missing only when it is empty; a numeric column keeps pandas' list.
"""
from __future__ import annotations

from collections.abc import Iterable

#: pandas' default missing-value spellings (``pandas.read_csv``'s ``na_values`` documentation)
NUMERIC_MISSING = ("", "#N/A", "#N/A N/A", "#NA", "-1.#IND", "-1.#QNAN", "-NaN", "-nan", "1.#IND", "1.#QNAN",
                   "<NA>", "N/A", "NA", "NULL", "NaN", "None", "n/a", "nan", "null")
#: a text column's only missing field: an empty one
TEXT_MISSING = ("",)
#: what a text column may hold where a missing value was meant, though it is read as a category:
#: pandas' spellings and the '?' of UCI files such as Adult (:func:`missing_lookalikes`)
MISSING_LOOKALIKES = frozenset(NUMERIC_MISSING[1:]) | {"?"}


def missing_spellings(columns: Iterable[str], text_columns: Iterable[str]) -> dict[str, tuple[str, ...]]:
    """``pandas.read_csv``'s ``na_values`` for a file of ``columns`` (pass ``keep_default_na=False``)."""
    text = set(text_columns)
    return {name: TEXT_MISSING if name in text else NUMERIC_MISSING for name in columns}


def missing_lookalikes(values: Iterable[object]) -> list[str]:
    """The values of a text column that spell a missing value elsewhere (``NA``, ``null``, ``?``,
    spaces around them aside), sorted: read here as categories of their own."""
    return sorted({str(value).strip() for value in values if str(value).strip() in MISSING_LOOKALIKES})


__all__ = ["MISSING_LOOKALIKES", "NUMERIC_MISSING", "TEXT_MISSING", "missing_lookalikes", "missing_spellings"]
