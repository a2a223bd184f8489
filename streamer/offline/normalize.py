"""Text normalisation and word error rate, for scoring transcripts against references.

Transcript conventions differ by source (LibriSpeech is upper case without punctuation, most others are mixed case
with punctuation), so both sides are normalised before they are compared. The normalisers are Whisper's own
(openai/whisper ``normalizers/``, MIT), as shipped by ``transformers.models.whisper.english_normalizer``; transformers
is imported lazily, on the first call.

The English normaliser applies Whisper's 1,700-entry British-to-American spelling map (``english.json``) when the
``openai-whisper`` distribution is installed (``pip install --no-deps openai-whisper``: only its data file is read,
its code is never imported, so none of its heavy dependencies are needed); without it the map is empty, which
scores ``counselled``/``counseled`` as an error, and :func:`spelling_map_source` says so. The test and evaluation
commands in the README install it.
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Literal

__all__ = [
    "WerResult",
    "WordEdit",
    "edit_operations",
    "english_normalizer",
    "normalize_basic",
    "normalize_english",
    "spelling_map_source",
    "word_edits",
    "word_error_rate",
]

Normalizer = Callable[[str], str]


@cache
def _basic() -> Normalizer:
    from transformers.models.whisper.english_normalizer import BasicTextNormalizer

    normalizer: Normalizer = BasicTextNormalizer()
    return normalizer


def _whisper_spelling_file() -> Path | None:
    """openai-whisper's ``normalizers/english.json``, located without importing the package."""
    spec = importlib.util.find_spec("whisper")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "normalizers" / "english.json"
    return path if path.is_file() else None


def spelling_map_source() -> str:
    """Where the English spelling map comes from, for reports: a path, or a note that it is empty."""
    path = _whisper_spelling_file()
    return str(path) if path else "none (pip install --no-deps openai-whisper to add Whisper's spelling map)"


@cache
def _english() -> Normalizer:
    path = _whisper_spelling_file()
    spelling: dict[str, str] = json.loads(path.read_text(encoding="utf-8")) if path else {}
    return english_normalizer(spelling)


def english_normalizer(spelling: Mapping[str, str]) -> Normalizer:
    """Whisper's English normaliser with ``spelling`` (British -> American word map) applied to every word."""
    from transformers.models.whisper.english_normalizer import EnglishTextNormalizer

    normalizer: Normalizer = EnglishTextNormalizer(dict(spelling))  # type: ignore[no-untyped-call]
    return normalizer


def normalize_english(text: str) -> str:
    """Whisper's English normalisation: lower case, no punctuation, numbers as digits, contractions expanded."""
    return _english()(text).strip()


def normalize_basic(text: str) -> str:
    """Whisper's language-neutral normalisation: lower case, no punctuation or bracketed text, single spaces."""
    return _basic()(text).strip()


@dataclass(frozen=True)
class WerResult:
    """Word error counts; add results with ``+`` to pool a data set (WER is pooled, not averaged)."""

    wer: float  # (substitutions + deletions + insertions) / words; see word_error_rate for empty references
    substitutions: int
    deletions: int
    insertions: int
    words: int  # reference words

    @property
    def errors(self) -> int:
        return self.substitutions + self.deletions + self.insertions

    def __add__(self, other: WerResult) -> WerResult:
        return _result(
            self.substitutions + other.substitutions,
            self.deletions + other.deletions,
            self.insertions + other.insertions,
            self.words + other.words,
        )


def _result(substitutions: int, deletions: int, insertions: int, words: int) -> WerResult:
    errors = substitutions + deletions + insertions
    # An empty reference (silence, noise) has no words to divide by: any output at all is a full error.
    wer = errors / words if words else float(errors > 0)
    return WerResult(wer, substitutions, deletions, insertions, words)


def edit_operations(ref: Sequence[str], hyp: Sequence[str]) -> tuple[int, int, int]:
    """(substitutions, deletions, insertions) of a minimal word alignment of ``hyp`` to ``ref`` (Levenshtein).

    Among alignments of equal cost, the one with the fewest substitutions wins, as in jiwer and sclite.
    """
    # Each cell holds (cost, substitutions, deletions, insertions); one row at a time keeps memory at O(len(hyp)).
    previous = [(j, 0, 0, j) for j in range(len(hyp) + 1)]
    for i, ref_word in enumerate(ref, start=1):
        current = [(i, 0, i, 0)]
        for j, hyp_word in enumerate(hyp, start=1):
            c, s, d, n = previous[j - 1]
            diagonal = (c, s, d, n) if ref_word == hyp_word else (c + 1, s + 1, d, n)
            c, s, d, n = previous[j]
            deletion = (c + 1, s, d + 1, n)
            c, s, d, n = current[j - 1]
            insertion = (c + 1, s, d, n + 1)
            current.append(min(diagonal, deletion, insertion, key=lambda cell: (cell[0], cell[1])))
        previous = current
    _, substitutions, deletions, insertions = previous[-1]
    return substitutions, deletions, insertions


EditKind = Literal["substitution", "deletion", "insertion"]


@dataclass(frozen=True)
class WordEdit:
    """One step of a minimal word alignment that is not a match.

    ``hyp_index`` is where in the hypothesis it happens: the inserted or substituted hypothesis word, or, for a
    deletion, the hypothesis word the missing reference word would have stood before (``len(hyp)`` at the end).
    """

    kind: EditKind
    ref_index: int  # the reference word (for an insertion, the reference word it stands before)
    hyp_index: int


def word_edits(ref: Sequence[str], hyp: Sequence[str]) -> list[WordEdit]:
    """The edits of the alignment :func:`edit_operations` counts, in order, with where each happens.

    Keeps the whole table, so memory is ``len(ref) * len(hyp)`` cells: for utterances and test transcripts, not for
    a data set pooled into one string.
    """
    rows, cols = len(ref) + 1, len(hyp) + 1
    # each cell: (cost, substitutions) of the best alignment of ref[:i] with hyp[:j]
    table = [[(0, 0)] * cols for _ in range(rows)]
    for j in range(cols):
        table[0][j] = (j, 0)
    for i in range(1, rows):
        table[i][0] = (i, 0)
        for j in range(1, cols):
            c, s = table[i - 1][j - 1]
            diagonal = (c, s) if ref[i - 1] == hyp[j - 1] else (c + 1, s + 1)
            c, s = table[i - 1][j]
            deletion = (c + 1, s)
            c, s = table[i][j - 1]
            insertion = (c + 1, s)
            table[i][j] = min(diagonal, deletion, insertion)
    edits: list[WordEdit] = []
    i, j = len(ref), len(hyp)
    while i or j:
        here = table[i][j]
        if i and j:
            c, s = table[i - 1][j - 1]
            if ref[i - 1] == hyp[j - 1] and here == (c, s):
                i, j = i - 1, j - 1
                continue
            if ref[i - 1] != hyp[j - 1] and here == (c + 1, s + 1):
                edits.append(WordEdit("substitution", i - 1, j - 1))
                i, j = i - 1, j - 1
                continue
        if i and here == (table[i - 1][j][0] + 1, table[i - 1][j][1]):
            edits.append(WordEdit("deletion", i - 1, j))
            i -= 1
        else:
            edits.append(WordEdit("insertion", i, j - 1))
            j -= 1
    edits.reverse()
    return edits


def word_error_rate(refs: Sequence[str], hyps: Sequence[str]) -> WerResult:
    """Pooled WER of ``hyps`` against ``refs`` (already normalised; words are split on whitespace).

    With no reference words at all, ``wer`` is 0.0 if the hypotheses are empty too and 1.0 otherwise.
    """
    if len(refs) != len(hyps):
        raise ValueError(f"{len(refs)} references but {len(hyps)} hypotheses")
    substitutions = deletions = insertions = words = 0
    for ref, hyp in zip(refs, hyps, strict=True):
        ref_words, hyp_words = ref.split(), hyp.split()
        s, d, n = edit_operations(ref_words, hyp_words)
        substitutions, deletions, insertions = substitutions + s, deletions + d, insertions + n
        words += len(ref_words)
    return _result(substitutions, deletions, insertions, words)
