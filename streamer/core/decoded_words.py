"""What one decoded window says about its utterance: its words in stream time once the guards trust it
(:func:`words_heard`), those of them not committed yet (:func:`new_words`), and, for the window that closes an
utterance and stopped early, where the utterance is decoded again from (:func:`resume_point`).
"""

from __future__ import annotations

from collections.abc import Sequence

from streamer.core.agreement import (
    GuardOptions,
    Verdict,
    check_result,
    normalize_word,
    spoken_before_loop,
    strip_committed_overlap,
)
from streamer.core.agreement import truncate_loops as _truncate_loops
from streamer.core.events import Word
from streamer.core.requests import DecodeResult
from streamer.core.units import SAMPLE_RATE
from streamer.core.utterance import Utterance
from streamer.core.windowing import Window

__all__ = ["clip", "new_words", "resume_point", "words_heard"]

_MS = SAMPLE_RATE // 1000
# an utterance's closing window is decoded again where the decoding stopped early (resume_after_ms) at most this many
# times, each starting at least a short word later than the window before ...
_MAX_RESUMES = 4
_RESUME_PROGRESS = 300 * _MS
# ... and re-reading at most this many committed words (strip_committed_overlap compares five)
_REREAD = 4


def words_heard(result: DecodeResult, window: Window, guards: GuardOptions) -> list[Word]:
    """The result's words in stream time, after the guards (none when it is not trusted); a hypothesis that loops is
    judged by the words it says before the loop."""
    spoken = spoken_before_loop(guards, [w.word for w in result.words])
    verdict = check_result(guards, result.no_speech_prob, result.avg_logprob, result.compression_ratio, spoken)
    if verdict is not Verdict.OK:
        return []
    words: list[Word] = []
    for w in result.words:
        text = w.word.strip()
        if not text:
            continue
        start = min(max(window.start + w.start, window.start), window.end)
        end = min(max(window.start + w.end, start), window.end)
        words.append(Word(text, start, end, w.probability))
    return words


def new_words(heard: list[Word], head: Utterance, committed: Sequence[Word], guards: GuardOptions) -> list[Word]:
    """The words ``heard`` in ``head``'s window that are not committed yet (``committed``: the stream's recent
    committed words), loops cut."""
    # a word mostly before the commit point was committed from an earlier window; a window that resumes where
    # the decoding stopped early keeps what it hears after its start in the utterance (the last committed word's
    # alignment may reach over speech no word was written for) and drops the committed words it re-reads by their
    # text or, where it says them differently, by their audio (_drop_rereads)
    since = head.committed if head.resume < 0 else max(head.start, min(head.committed, head.resume))
    words = [w for w in heard if (w.start + w.end) // 2 >= since and w.end > since]
    if head.committed > min(head.start, head.anchor):  # words were committed before the window's new audio
        kept = strip_committed_overlap([w.text for w in committed[-5:]], words)
        if len(kept) == len(words) and since < head.committed:  # a resumed window that re-read them differently
            kept = _drop_rereads(words, [w for w in committed if w.end > since])
        words = kept
    return list(_truncate_loops(guards, words))


def _drop_rereads(words: list[Word], reread: Sequence[Word]) -> list[Word]:
    """``words`` less those at their front that re-read the committed words ``reread``, one for one and in order: a
    word is a re-read of the next committed word when it says the same or, in other words, when it lies mostly
    over that word's audio (a resumed window re-read "a certain flavor of romance" as "different flavor of Romans";
    their text alone let them through). A word past the re-read ones is kept, however it overlaps."""
    dropped = 0
    for w, c in zip(words, reread, strict=False):
        if not (normalize_word(w.text) == normalize_word(c.text) or _mostly_over(w, c)):
            break
        dropped += 1
    return words[dropped:]


def _mostly_over(word: Word, other: Word) -> bool:
    """Whether ``word`` lies mostly over ``other``'s audio (a zero-length one: inside it)."""
    if word.end == word.start:
        return other.start <= word.start <= other.end
    shared = min(word.end, other.end) - max(word.start, other.start)
    return shared * 2 > min(word.end - word.start, max(other.end - other.start, 1))


def resume_point(
    head: Utterance,
    window: Window,
    heard: list[Word],
    committed: Sequence[Word],
    resume_after: int,
    guards: GuardOptions,
) -> int | None:
    """Where the utterance's closing ``window`` should be decoded again from, because its words stop more than
    ``resume_after`` samples (``resume_after_ms``; 0: never) before its speech does, or None: commit what it heard
    and the rest of the audio.

    It is the end of the window's last word but one: the decoder writes a word and stops, and DTW then stretches
    or moves that last word into the speech left unwritten (tiny.en put "and" 2 to 3 s after "one day," with
    "unluckily, fell asleep..." in between). Each resumption starts at least 300 ms after the window it follows,
    and an utterance resumes at most four times; a hypothesis cut for looping, or of one word, is committed as it
    is."""
    if not resume_after or head.resumes >= _MAX_RESUMES or len(heard) < 2:
        return None
    if head.speech_end - heard[-1].start <= resume_after or len(_truncate_loops(guards, heard)) < len(heard):
        return None
    resume = heard[-2].end
    # the committed words it re-reads are recognised by their text, as many as strip_committed_overlap compares
    if len(committed) > _REREAD and committed[-_REREAD - 1].end > resume:
        resume = committed[-_REREAD - 1].end
    if not window.start + _RESUME_PROGRESS <= resume < head.speech_end:
        return None
    return resume


def clip(word: Word, start: int, end: int) -> Word:
    """``word`` with its timing clipped to ``[start, end]``."""
    lo = min(max(word.start, start), end)
    return Word(word.text, lo, min(max(word.end, lo), end), word.probability)
