from __future__ import annotations

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
