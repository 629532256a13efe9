"""Answer normalisation and exact match, as Search-R1 scores answers.

Both sides are lower-cased, punctuation is removed, the articles a/an/the are dropped and whitespace is
collapsed; an answer scores 1 when it equals any normalised gold answer.
"""

from __future__ import annotations

import re
import string
from collections.abc import Iterable

__all__ = ["normalize_answer", "exact_match"]

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = str.maketrans("", "", string.punctuation)


def normalize_answer(text: str) -> str:
    """`"The  Orvane Co."` -> `"orvane co"`. Articles are removed after punctuation so that "the-end"
    keeps its words ("theend") exactly as the reference scorer does."""
    lowered = text.lower().translate(_PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", lowered).split())


def exact_match(prediction: str, golden_answers: Iterable[str]) -> bool:
    """True when the normalised prediction equals one of the normalised gold answers."""
    predicted = normalize_answer(prediction)
    return any(predicted == normalize_answer(gold) for gold in golden_answers)
