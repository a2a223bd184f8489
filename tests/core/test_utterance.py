from __future__ import annotations

from streamer.core.events import Word
from streamer.core.utterance import Utterance

SR = 16000


def utterance(anchor: int, committed: int, sentence_end: int, speech_end: int) -> Utterance:
    return Utterance(0, speech_end, committed, committed, anchor=anchor, sentence_end=sentence_end)


def test_short_windows_keep_their_start() -> None:
    u = utterance(anchor=0, committed=4 * SR, sentence_end=3 * SR, speech_end=9 * SR)
    u.move_anchor(10 * SR)
    assert u.anchor == 0


def test_long_windows_start_after_the_last_committed_sentence() -> None:
    u = utterance(anchor=0, committed=8 * SR, sentence_end=6 * SR, speech_end=12 * SR)
    u.move_anchor(10 * SR)
    assert u.anchor == 6 * SR


def test_windows_past_twice_the_limit_without_a_sentence_end_start_at_the_commit_point() -> None:
    u = utterance(anchor=0, committed=15 * SR, sentence_end=-1, speech_end=12 * SR)
    u.move_anchor(10 * SR)
    assert u.anchor == 0  # over the limit, under twice it, no sentence end: kept
    u.speech_end = 21 * SR
    u.move_anchor(10 * SR)
    assert u.anchor == 15 * SR


def test_windows_trimmed_mid_sentence_keep_the_committed_words_of_the_context_before_the_commit_point() -> None:
    """Past twice the limit the window starts at the first committed word within trim_context_ms of the commit
    point (a word's start, never inside one), not at the commit point itself, where Whisper hears a cut word."""
    words = [Word(f"w{i}", i * SR, i * SR + SR // 2, 1.0) for i in range(15)]  # one a second, committed up to 15 s
    u = utterance(anchor=0, committed=15 * SR, sentence_end=-1, speech_end=21 * SR)
    u.move_anchor(10 * SR, words, context=3 * SR + SR // 4)
    assert u.anchor == 12 * SR  # w12 starts 3 s before the commit point, w11 4 s
    u = utterance(anchor=0, committed=15 * SR, sentence_end=-1, speech_end=21 * SR)
    u.move_anchor(10 * SR, words[:3], context=3 * SR)  # no committed word within the context: the commit point
    assert u.anchor == 15 * SR
    u = utterance(anchor=13 * SR, committed=15 * SR, sentence_end=-1, speech_end=34 * SR)
    u.move_anchor(10 * SR, words, context=5 * SR)  # never back before the anchor
    assert u.anchor == 13 * SR
