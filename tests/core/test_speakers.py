"""Speaker tracking on synthetic embeddings (issue 40): separate voices stay separate and keep their numbers, a
turn change inside an utterance lands between the right words, ``max_speakers`` holds, a lone outlier makes no
speaker, and bad options are refused by name."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import numpy.typing as npt
import pytest

from streamer.core.errors import ConfigError
from streamer.core.speakers import (
    MAX_SPEAKERS,
    SpeakerOptions,
    SpeakerTracker,
    SpeechSpan,
    WindowLabel,
    assign_words,
    next_window_index,
    plan_windows,
)

DIM = 256
OPTIONS = SpeakerOptions(window_ms=1600, step_ms=500)  # round numbers for the word timings below
STEP = OPTIONS.step_samples
WINDOW = OPTIONS.window_samples


def voices(count: int, seed: int = 0) -> npt.NDArray[np.float64]:
    """``count`` random unit directions: far apart in 256 dimensions (cosine about 0)."""
    rng = np.random.default_rng(seed)
    v = rng.standard_normal((count, DIM))
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def noisy(voice: npt.NDArray[np.float64], rng: np.random.Generator, spread: float = 0.03) -> npt.NDArray[np.float64]:
    """A window's embedding of ``voice``: cosine about 0.9 to the voice, 0.8 to another window of it."""
    return voice + rng.standard_normal(DIM) * spread


def track(sequence: list[int], options: SpeakerOptions = OPTIONS, seed: int = 1) -> list[WindowLabel]:
    """Windows on the grid whose embeddings come from ``voices()[sequence[i]]``; their final labels."""
    rng = np.random.default_rng(seed)
    directions = voices(max(sequence) + 1)
    tracker = SpeakerTracker(options)
    for i, who in enumerate(sequence):
        tracker.receive_window(i * STEP, i * STEP + WINDOW, noisy(directions[who], rng))
    return tracker.labels()


def test_separate_voices_stay_separate_and_keep_their_numbers() -> None:
    sequence = [0] * 8 + [1] * 6 + [2] * 5 + [0] * 6 + [1] * 4 + [2] * 4
    labels = track(sequence)
    assert [label.speaker for label in labels] == [{0: 0, 1: 1, 2: 2}[who] for who in sequence]
    assert not any(label.provisional for label in labels)


def test_a_lone_outlier_makes_no_speaker_and_keeps_the_nearest_label() -> None:
    rng = np.random.default_rng(3)
    a, b, stray = voices(3, seed=5)
    tracker = SpeakerTracker(OPTIONS)
    for i in range(10):
        embedding = stray if i == 5 else noisy(a if i < 8 else b, rng)
        tracker.receive_window(i * STEP, i * STEP + WINDOW, embedding)
    labels = tracker.labels()
    assert tracker.speakers == 2
    assert labels[5].speaker == 0 and not labels[5].provisional  # a match after it settled it as an outlier
    assert [label.speaker for label in labels[8:]] == [1, 1]


def test_a_candidate_is_provisional_until_confirmed_and_settled_stops_before_it() -> None:
    rng = np.random.default_rng(4)
    a, b = voices(2)
    tracker = SpeakerTracker(OPTIONS)
    for i in range(4):
        tracker.receive_window(i * STEP, i * STEP + WINDOW, noisy(a, rng))
    assert tracker.settled == 3 * STEP + WINDOW
    first = tracker.receive_window(4 * STEP, 4 * STEP + WINDOW, noisy(b, rng))
    assert first.provisional and first.speaker == 0 and tracker.speakers == 1
    assert tracker.settled == 3 * STEP + WINDOW  # the candidate's label may change: nothing from it on is final
    second = tracker.receive_window(5 * STEP, 5 * STEP + WINDOW, noisy(b, rng))
    assert second.speaker == 1 and not second.provisional
    assert [label.speaker for label in tracker.labels()[4:]] == [1, 1]  # the first candidate relabelled
    assert tracker.settled == 5 * STEP + WINDOW


@pytest.mark.parametrize("limit", [1, 2])
def test_max_speakers_holds(limit: int) -> None:
    labels = track([0] * 4 + [1] * 4 + [2] * 4 + [3] * 4, replace(OPTIONS, max_speakers=limit))
    assert {label.speaker for label in labels} == set(range(limit))


def test_a_silent_window_keeps_the_previous_speaker() -> None:
    a, b = voices(2)
    tracker = SpeakerTracker(replace(OPTIONS, confirm_windows=1))
    assert tracker.receive_window(0, WINDOW, np.zeros(DIM)).speaker == 0
    tracker.receive_window(STEP, STEP + WINDOW, a)
    tracker.receive_window(2 * STEP, 2 * STEP + WINDOW, b)
    assert tracker.receive_window(3 * STEP, 3 * STEP + WINDOW, np.zeros(DIM)).speaker == 1
    assert tracker.speakers == 2


def test_windows_must_come_in_stream_order() -> None:
    tracker = SpeakerTracker(OPTIONS)
    tracker.receive_window(STEP, STEP + WINDOW, voices(1)[0])
    with pytest.raises(ValueError, match="before"):
        tracker.receive_window(0, WINDOW, voices(1)[0])


@dataclass(frozen=True)
class Word:
    start: int
    end: int


def words_at(seconds: list[tuple[float, float]]) -> list[Word]:
    return [Word(round(a * 16000), round(b * 16000)) for a, b in seconds]


def grid_labels(speakers: list[int]) -> list[WindowLabel]:
    return [WindowLabel(i * STEP, i * STEP + WINDOW, s, 0.9) for i, s in enumerate(speakers)]


def test_a_turn_change_inside_an_utterance_lands_at_the_pause() -> None:
    # windows every 0.5 s; their centres are 0.8 s in: speaker 0 to the window centred at 2.8 s, then 1 from 3.3 s.
    # The words run back to back but for a 0.2 s pause from 2.9 to 3.1 s, the true change
    labels = grid_labels([0] * 5 + [1] * 5)
    words = words_at([(2.0, 2.3), (2.3, 2.6), (2.6, 2.9), (3.1, 3.4), (3.4, 3.7), (3.7, 4.0)])
    assert assign_words(words, labels, STEP) == [0, 0, 0, 1, 1, 1]
    # the same words with the pause moved to 3.4-3.6 s: the change follows the pause, not the window grid
    words = words_at([(2.0, 2.3), (2.3, 2.6), (2.6, 2.9), (2.9, 3.2), (3.2, 3.4), (3.6, 4.0)])
    assert assign_words(words, labels, STEP) == [0, 0, 0, 0, 0, 1]


def test_without_a_pause_the_change_is_midway_between_the_windows() -> None:
    labels = grid_labels([0] * 5 + [1] * 5)  # centres 2.8 s (speaker 0) and 3.3 s (speaker 1): midway 3.05 s
    words = words_at([(2.5, 2.8), (2.8, 3.05), (3.05, 3.3), (3.3, 3.6)])
    assert assign_words(words, labels, STEP) == [0, 0, 1, 1]


def test_words_far_from_any_window_take_the_nearest_and_no_windows_give_none() -> None:
    labels = grid_labels([0, 0, 1])
    assert assign_words(words_at([(30.0, 30.5), (0.0, 0.1)]), labels, STEP) == [1, 0]
    assert assign_words(words_at([(1.0, 1.5)]), [], STEP) == [None]


def test_windows_are_planned_on_a_grid_where_there_is_speech() -> None:
    speech = [SpeechSpan(16000, 64000)]  # 1 to 4 s
    starts = plan_windows(speech, 0, 96000, OPTIONS)
    # a 1.6 s window is planned where at least half of it (0.8 s) is speech and it ends by 6 s: from 0.5 to 3 s
    assert starts == [k * STEP for k in range(1, 7)]
    assert all((s + WINDOW) <= 96000 for s in starts)
    # incremental: the same windows whatever the audio came in as
    first = plan_windows(speech, 0, 40000, OPTIONS)
    rest = plan_windows(speech, next_window_index(40000, OPTIONS), 96000, OPTIONS)
    assert first + rest == starts


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("max_speakers", 0, "max_speakers"),
        ("max_speakers", MAX_SPEAKERS + 1, "max_speakers"),
        ("window_ms", 100, "window_ms"),
        ("step_ms", 5000, "step_ms"),
        ("new_speaker_distance", 0.0, "new_speaker_distance"),
        ("confirm_windows", 0, "confirm_windows"),
        ("min_speech_share", 0.0, "min_speech_share"),
    ],
)
def test_invalid_options_are_refused_by_name(field: str, value: object, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        SpeakerTracker(SpeakerOptions(**{field: value}))  # type: ignore[arg-type]


def test_max_speakers_bounds_are_allowed() -> None:
    for limit in (1, MAX_SPEAKERS, None):
        SpeakerOptions(max_speakers=limit).validate()
