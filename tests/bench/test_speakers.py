"""The speaker-label measurement (issue 40): our frame-level DER and word attribution score what they say (best
one-to-one label mapping, collar, overlap skipped), and the voice encoder with the tracker's defaults labels a set of
synthetic LibriSpeech conversations above a measured bound."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from streamer.bench.conversations import Conversation, ReferenceWord, Turn, build_conversations
from streamer.bench.speakers import (
    FRAME,
    Frame,
    best_mapping,
    diarization_error,
    diarize_live,
    embed_conversation,
    pool,
    pool_live,
    score,
    word_attribution,
)
from streamer.core.speakers import SpeakerOptions

SECOND = 16000


def two_turns() -> Conversation:
    """Speaker a from 0 to 4 s, b from 5 to 9 s, in 10 s of audio."""
    turns = (Turn("a", 0, 4 * SECOND, "u1", ()), Turn("b", 5 * SECOND, 9 * SECOND, "u2", ()))
    return Conversation("two", np.zeros(10 * SECOND, dtype=np.float32), turns, "tune")


def frames(start_s: float, end_s: float) -> list[Frame]:
    return [Frame(f, f + FRAME) for f in range(round(start_s * SECOND), round(end_s * SECOND), FRAME)]


def test_best_mapping_is_one_to_one_and_maximal() -> None:
    common = np.array([[5, 9], [6, 1], [0, 2]], dtype=np.int64)
    assert best_mapping(common) == {0: 1, 1: 0}  # 9 + 6 beats every other pairing; label 2 stays unmapped
    assert best_mapping(common.T.copy()) == {1: 0, 0: 1}


def test_der_is_zero_for_the_truth_under_any_label_names() -> None:
    conversation = two_turns()
    hyp = frames(0, 4) + frames(5, 9)
    labels: list[int | None] = [7] * 400 + [3] * 400
    result = diarization_error(conversation, hyp, labels)
    # 8 s of speech less the 0.25 s of it inside the collar of each of the four boundaries
    assert result.scored == 800 - 4 * 25
    assert result.der == 0.0


def test_der_counts_missed_speech_false_alarm_and_confusion_outside_the_collar() -> None:
    conversation = two_turns()
    # the second turn labelled like the first from 7 s: 2 s of confusion less its collar at 9 s (0.25 s)
    hyp = frames(0, 4) + frames(5, 9)
    labels: list[int | None] = [0] * 400 + [1] * 200 + [0] * 200
    assert diarization_error(conversation, hyp, labels).confusion == 175
    # nothing said from 1 to 2 s: missed; speech "heard" from 4.8 to 4.9 s: inside the collar, not scored, and
    # from 9.5 to 10 s: false alarm
    hyp = frames(0, 1) + frames(2, 4) + frames(4.8, 4.9) + frames(5, 9) + frames(9.5, 10)
    labels = [0] * (len(hyp) - 400 - 50) + [1] * 400 + [1] * 50
    result = diarization_error(conversation, hyp, labels)
    assert (result.missed, result.false_alarm, result.confusion) == (100, 50, 0)


def test_overlapping_speech_is_not_scored() -> None:
    turns = (Turn("a", 0, 6 * SECOND, "u1", ()), Turn("b", 4 * SECOND, 9 * SECOND, "u2", ()))
    conversation = Conversation("overlap", np.zeros(10 * SECOND, dtype=np.float32), turns, "tune")
    hyp = frames(0, 9)
    labels: list[int | None] = [0] * 500 + [1] * 400  # the change at 5 s, inside the overlap
    result = diarization_error(conversation, hyp, labels)
    assert result.der == 0.0


def test_word_attribution_counts_words_right_under_the_best_mapping() -> None:
    words = [ReferenceWord(i, i + 1, "w", s) for i, s in enumerate("aaabbbcc")]
    assert word_attribution(words, [5, 5, 5, 2, 2, 2, 9, 9]) == 8
    assert word_attribution(words, [5, 5, 2, 2, 2, 2, 9, 9]) == 7  # one word of a given to b
    assert word_attribution(words, [5, 5, 5, 5, 5, 5, 5, 5]) == 3  # one label: one speaker's words right
    assert word_attribution(words, [None] * 8) == 0


@pytest.fixture(scope="module")
def conversations(shared_data: Path) -> list[Conversation]:
    """Four conversations of the report half (2 to 4 readers each, 20 to 60 s)."""
    return build_conversations("report", 4, seed=1, data=shared_data)


# Measured on these four with the defaults (torch on one thread): every word right, every speaker count right, DER
# 4.9 % (missed speech, mostly: the VAD's); on the bench's six (python -m streamer.bench.speakers, seed 0): 97.6 %,
# 6 of 6, 5.5 %. The bounds leave room for the VAD and for torch's kernels, not for a tracker that splits a speaker
ATTRIBUTION_BOUND = 0.95
COUNT_BOUND = 3
DER_BOUND = 0.10


@pytest.mark.skipif(
    importlib.util.find_spec("resemblyzer") is None,
    reason="the Resemblyzer package is not installed (pip install --no-deps Resemblyzer==0.1.4)",
)
def test_speakers_are_labelled_on_a_set_of_synthetic_conversations(conversations: list[Conversation]) -> None:
    from streamer.engine.speaker_encoder import load_speaker_encoder

    options = SpeakerOptions()
    encoder = load_speaker_encoder()
    scores = [score(embed_conversation(c, encoder, options), options) for c in conversations]
    pooled = pool(scores)
    assert pooled.attribution >= ATTRIBUTION_BOUND, pooled.line()
    assert pooled.count_right >= COUNT_BOUND, pooled.line()
    assert pooled.der <= DER_BOUND, pooled.line()


@pytest.mark.skipif(
    importlib.util.find_spec("resemblyzer") is None,
    reason="the Resemblyzer package is not installed (pip install --no-deps Resemblyzer==0.1.4)",
)
def test_the_live_diarizer_labels_the_set_as_well_and_holds_finals_briefly(conversations: list[Conversation]) -> None:
    """The server's path (streamer.core.diarization, 100 ms chunks, finals at their end points plus a 300 ms
    decode). Measured on these four: 99.5 % of words right, 4 of 4 counts, no final held (p95 0 ms)."""
    from streamer.engine.speaker_encoder import load_speaker_encoder

    encoder = load_speaker_encoder()
    live = pool_live([diarize_live(c, encoder, SpeakerOptions(), decode_ms=300) for c in conversations])
    assert live.attribution >= ATTRIBUTION_BOUND, live.line()
    assert live.count_right >= COUNT_BOUND, live.line()
    # a final waits for the windows up to its last word: at most a window step and the VAD's decision after its
    # end point, and most not at all
    assert live.hold_p95_ms <= 750, live.line()
    assert live.hold_p50_ms <= 300, live.line()
