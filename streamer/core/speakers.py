"""Who speaks when on one channel (issue 40): sliding-window planning, incremental clustering of speaker embeddings,
and words given speakers by their times. Sans-I/O and model-free: the embeddings come from whoever runs the voice
encoder (:mod:`streamer.engine.speaker_encoder`); this module only sees arrays and sample counts.

The pipeline, per channel:

1. :func:`plan_windows`: windows of ``window_ms`` on a grid every ``step_ms`` of stream time, those mostly speech
   (by the VAD's spans). The grid makes planning incremental: a window is planned once the audio to its end is
   known, whatever the chunking.
2. The engine embeds them (unit vectors); :meth:`SpeakerTracker.receive_window` labels each, in stream order, with a
   small integer speaker that stays the same for the session.
3. :func:`assign_words` gives each word (start/end samples) the speaker of the windows around it, and moves a
   change of speaker between two windows to the longest pause between the words there, so that a turn change
   inside one utterance (or one final) lands between the right words.

The tracker (online clustering over running centroids, Wang et al. 2018, "Speaker Diarization with LSTM", arXiv
1710.10468, the online form): a window whose cosine similarity to the nearest speaker's centroid is at least
``1 - new_speaker_distance`` joins that speaker and moves its centroid; one that is farther from every speaker is
held as a candidate. ``confirm_windows`` consecutive candidates that agree with each other make a new speaker (and
are relabelled to it); a lone outlier (a window straddling a turn change, a cough, overlapping voices) keeps the
nearest speaker's label and moves no centroid. At ``max_speakers`` no speaker is made: the nearest takes the window.

Labels settle: a window's label can only change while it is a candidate, so every label of a window that ends at
or before :attr:`SpeakerTracker.settled` is final.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt

from streamer.core.errors import ConfigError
from streamer.core.units import SAMPLE_RATE

__all__ = [
    "MAX_SPEAKERS",
    "SpeakerOptions",
    "SpeakerTracker",
    "SpeechSpan",
    "TimedWord",
    "WindowLabel",
    "assign_words",
    "next_window_index",
    "plan_windows",
]

MAX_SPEAKERS = 32  # the most a session may ask for (issue 40: max_speakers is 1 to 32)
_MS = SAMPLE_RATE // 1000


@dataclass(frozen=True)
class SpeakerOptions:
    """How one channel's speakers are told apart. Validated in :meth:`validate`. Each default is the best of a sweep
    on 12 synthetic LibriSpeech conversations of the tuning half of the readers (``python -m streamer.bench.speakers
    --tune``: windows 1.6 s every 0.5 s, 1.6 s every 0.75 s and 2 s every 0.75 s; distances 0.2 to 0.45; 1 to 3
    confirming windows), reported on the other half (streamer/bench/speakers.py)."""

    # each embedding reads this much audio. 2 s every 0.75 s: 99.1 % of the tuning half's words right, its speaker
    # count right in 12 conversations of 12, DER 3.8 %; 1.6 s (the encoder's training length) every 0.5 s: 96.4 %,
    # 9 of 12, DER 6.1 %; 1.6 s every 0.75 s: 96.9 %, 9 of 12. A longer window's embedding is steadier; the pause
    # snapping of assign_words, not the window, places a change of speaker
    window_ms: int = 2000
    # a window starts every step: the encoder's cost (one window per step of speech: 7.8 ms of one core per second
    # of audio at 2 s every 0.75 s, 9.5 ms at 1.6 s every 0.5 s)
    step_ms: int = 750
    # a window this far (cosine distance) from every speaker's centroid is a new-speaker candidate. At 2 s every
    # 0.75 s: 0.3 as above, 0.25 at best 97.0 % and 10 counts of 12; no other distance made the sweep's top ten
    new_speaker_distance: float = 0.3
    # consecutive candidates that agree (within new_speaker_distance of their mean) before they make a new speaker.
    # 1 makes one from any outlier (a window astride a turn change): 7 counts of 12 right at 2 s; 3 waits too long
    # for a short first turn: 11 of 12; 2: 12 of 12
    confirm_windows: int = 2
    # the most speakers the session may have (1 to MAX_SPEAKERS); None: MAX_SPEAKERS
    max_speakers: int | None = None
    # a window is embedded only when at least this share of it is speech (by the VAD): windows of silence have no
    # voice to embed
    min_speech_share: float = 0.5

    def validate(self) -> None:
        """Raise :class:`~streamer.core.errors.ConfigError` naming the first invalid field."""
        if not 400 <= self.window_ms <= 10000:
            raise ConfigError("speaker window_ms must be between 400 and 10000")
        if not 100 <= self.step_ms <= self.window_ms:
            raise ConfigError(f"speaker step_ms must be between 100 and window_ms ({self.window_ms})")
        if not 0.0 < self.new_speaker_distance < 2.0:
            raise ConfigError("speaker new_speaker_distance must be between 0 and 2 (cosine distance)")
        if not 1 <= self.confirm_windows <= 10:
            raise ConfigError("speaker confirm_windows must be between 1 and 10")
        if self.max_speakers is not None and not 1 <= self.max_speakers <= MAX_SPEAKERS:
            raise ConfigError(f"max_speakers must be between 1 and {MAX_SPEAKERS}")
        if not 0.0 < self.min_speech_share <= 1.0:
            raise ConfigError("speaker min_speech_share must be above 0 and at most 1")

    @property
    def window_samples(self) -> int:
        return self.window_ms * _MS

    @property
    def step_samples(self) -> int:
        return self.step_ms * _MS

    @property
    def speaker_limit(self) -> int:
        return MAX_SPEAKERS if self.max_speakers is None else self.max_speakers


@dataclass(frozen=True)
class SpeechSpan:
    """``[start, end)`` samples of speech, as the VAD found it."""

    start: int
    end: int


def plan_windows(speech: Sequence[SpeechSpan], first: int, end: int, options: SpeakerOptions) -> list[int]:
    """Start samples of the windows to embed among grid windows ``first, first + 1, ...`` (window ``k`` starts at
    ``k * step_samples``) that end by ``end`` (the audio known so far): those at least ``min_speech_share`` speech.
    Call again with ``first`` past the last grid index considered (``end - window_samples) // step_samples + 1``,
    see :func:`next_window_index`) as audio and spans arrive; ``speech`` must cover the planned range."""
    starts: list[int] = []
    window, step = options.window_samples, options.step_samples
    last = (end - window) // step
    need = options.min_speech_share * window
    for k in range(first, last + 1):
        start = k * step
        covered = sum(max(0, min(s.end, start + window) - max(s.start, start)) for s in speech)
        if covered >= need:
            starts.append(start)
    return starts


def next_window_index(end: int, options: SpeakerOptions) -> int:
    """The first grid window that does not end by ``end``: where the next :func:`plan_windows` call starts."""
    return max(0, (end - options.window_samples) // options.step_samples + 1)


@dataclass(frozen=True)
class WindowLabel:
    """An embedded window ``[start, end)`` and the speaker it was given."""

    start: int
    end: int
    speaker: int
    # cosine similarity to that speaker's centroid when labelled (1.0 for a speaker's first window)
    similarity: float
    # True while the window is a new-speaker candidate: its label may still change
    provisional: bool = False

    @property
    def centre(self) -> int:
        return (self.start + self.end) // 2


class SpeakerTracker:
    """One channel's speakers, for a whole session. Feed :meth:`receive_window` the embedded windows in stream
    order; read :meth:`labels` (final up to :attr:`settled`) and give words speakers with :func:`assign_words`."""

    def __init__(self, options: SpeakerOptions | None = None) -> None:
        self.options = options if options is not None else SpeakerOptions()
        self.options.validate()
        self._sums: list[npt.NDArray[np.float64]] = []  # per speaker: the sum of its windows' unit embeddings
        self._counts: list[int] = []
        self._labels: list[WindowLabel] = []
        self._candidates: list[tuple[int, npt.NDArray[np.float64]]] = []  # (index in _labels, unit embedding)

    @property
    def speakers(self) -> int:
        """How many speakers the session has so far."""
        return len(self._sums)

    @property
    def settled(self) -> int:
        """Labels of windows ending at or before this sample are final (the end of the last window, when none is a
        candidate)."""
        if self._candidates:
            first = self._labels[self._candidates[0][0]]
            return max((w.end for w in self._labels[: self._candidates[0][0]]), default=first.start)
        return self._labels[-1].end if self._labels else 0

    def labels(self) -> list[WindowLabel]:
        """Every window's label so far (since the last :meth:`forget_before`), in stream order."""
        return list(self._labels)

    def labels_between(self, start: int, end: int) -> list[WindowLabel]:
        """The labels of the windows that overlap ``[start, end)``, in stream order: O(log n) to find them."""
        first = bisect.bisect_right(self._labels, start, key=lambda w: w.end)
        last = bisect.bisect_left(self._labels, end, lo=first, key=lambda w: w.start)
        return self._labels[first:last]

    @property
    def first_provisional_end(self) -> int:
        """The end of the first window whose label may still change; 0 when every label is final."""
        return self._labels[self._candidates[0][0]].end if self._candidates else 0

    @property
    def first_provisional_start(self) -> int | None:
        """The start of the first window whose label may still change (a new-speaker candidate); None when every
        label is final."""
        return self._labels[self._candidates[0][0]].start if self._candidates else None

    def forget_before(self, position: int) -> None:
        """Drop the labels of windows ending before ``position`` (never a candidate's): a live session keeps only
        those its next words may need. The speakers and their centroids stay."""
        cut = bisect.bisect_left(self._labels, position, key=lambda w: w.end)
        if self._candidates:
            cut = min(cut, self._candidates[0][0])
        if cut < 64:  # in bursts: a list's front is dear to drop one at a time
            return
        del self._labels[:cut]
        self._candidates = [(index - cut, unit) for index, unit in self._candidates]

    def windows_of(self, speaker: int) -> int:
        """How many windows speaker ``speaker`` has (its centroid's weight)."""
        return self._counts[speaker]

    def receive_window(self, start: int, end: int, embedding: npt.ArrayLike) -> WindowLabel:
        """Label the embedded window ``[start, end)`` (its embedding: any scale; a zero vector keeps the previous
        window's speaker, or speaker 0). Returns its label, which is provisional while it is a new-speaker
        candidate. Windows must come in stream order."""
        if self._labels and start < self._labels[-1].start:
            raise ValueError(f"window at {start} is before the previous one at {self._labels[-1].start}")
        vector = np.asarray(embedding, dtype=np.float64).reshape(-1)
        norm = float(np.linalg.norm(vector))
        if norm == 0.0 or not np.isfinite(norm):
            speaker = self._labels[-1].speaker if self._labels else 0
            if not self._sums:
                return self._append(WindowLabel(start, end, 0, 0.0))  # no speaker yet: no centroid to move
            return self._append(WindowLabel(start, end, speaker, 0.0))
        unit = vector / norm
        if not self._sums:
            self._new_speaker([unit])
            return self._append(WindowLabel(start, end, 0, 1.0))
        similarities = self._centroids() @ unit
        best = int(np.argmax(similarities))
        similarity = float(similarities[best])
        joins = similarity >= 1.0 - self.options.new_speaker_distance
        if joins or self.speakers >= self.options.speaker_limit:
            # a match ends any run of candidates: they were outliers and keep their nearest speakers' labels
            self._settle_candidates()
            if joins:
                self._sums[best] += unit
                self._counts[best] += 1
            return self._append(WindowLabel(start, end, best, similarity))
        return self._candidate(start, end, unit, best, similarity)

    def _candidate(
        self, start: int, end: int, unit: npt.NDArray[np.float64], best: int, similarity: float
    ) -> WindowLabel:
        if self._candidates:
            mean = np.sum([u for _, u in self._candidates], axis=0)
            if float(mean @ unit) / float(np.linalg.norm(mean)) < 1.0 - self.options.new_speaker_distance:
                self._settle_candidates()  # this one disagrees with the run before it: a new run starts here
        label = self._append(WindowLabel(start, end, best, similarity, provisional=True))
        self._candidates.append((len(self._labels) - 1, unit))
        if len(self._candidates) < self.options.confirm_windows:
            return label
        speaker = self._new_speaker([u for _, u in self._candidates])
        for index, _ in self._candidates:
            old = self._labels[index]
            self._labels[index] = WindowLabel(old.start, old.end, speaker, old.similarity)
        self._candidates = []
        return self._labels[-1]

    def _settle_candidates(self) -> None:
        for index, _ in self._candidates:
            old = self._labels[index]
            self._labels[index] = WindowLabel(old.start, old.end, old.speaker, old.similarity)
        self._candidates = []

    def _new_speaker(self, units: Sequence[npt.NDArray[np.float64]]) -> int:
        self._sums.append(np.sum(units, axis=0))
        self._counts.append(len(units))
        return len(self._sums) - 1

    def _centroids(self) -> npt.NDArray[np.float64]:
        sums = np.stack(self._sums)
        centroids: npt.NDArray[np.float64] = sums / np.linalg.norm(sums, axis=1, keepdims=True)
        return centroids

    def _append(self, label: WindowLabel) -> WindowLabel:
        self._labels.append(label)
        return label


class TimedWord(Protocol):
    """Anything with ``start`` and ``end`` stream samples: the core's decoded words, a bench's reference words."""

    @property
    def start(self) -> int: ...

    @property
    def end(self) -> int: ...


def assign_words(words: Sequence[TimedWord], labels: Sequence[WindowLabel], step: int) -> list[int | None]:
    """The speaker of each of ``words`` (in stream order), from window ``labels`` (in stream order) a grid of
    ``step`` samples apart; None for every word when there is no label.

    Each window claims ``step`` samples around its centre; a word takes the speaker whose claims it overlaps most
    (the nearest claim's when it overlaps none). Where two neighbouring windows disagree, the change of speaker is
    somewhere between their centres, give or take half a step: the words there are split at the longest pause
    between them (before the first or after the last, counting the pauses to the words outside), since people change
    turns at pauses; the words before it take the earlier speaker, the rest the later."""
    if not labels:
        return [None] * len(words)
    centres = np.array([w.centre for w in labels], dtype=np.int64)
    speakers = [label.speaker for label in labels]
    half = step // 2
    result: list[int | None] = []
    for word in words:
        lo = int(np.searchsorted(centres, word.start - half, side="left"))
        hi = int(np.searchsorted(centres, word.end + half, side="right"))
        overlap: dict[int, int] = {}
        for i in range(max(0, lo - 1), min(len(centres), hi + 1)):
            centre = int(centres[i])
            shared = min(word.end, centre + half) - max(word.start, centre - half)
            if shared > 0:
                overlap[speakers[i]] = overlap.get(speakers[i], 0) + shared
        if overlap:
            result.append(max(overlap, key=lambda s: (overlap[s], -s)))
        else:
            middle = (word.start + word.end) // 2
            nearest = int(np.argmin(np.abs(centres - middle)))
            result.append(speakers[nearest])
    for i in range(len(labels) - 1):
        lo, hi = int(centres[i]) - half, int(centres[i + 1]) + half
        if speakers[i] != speakers[i + 1] and hi - lo <= 3 * step:
            _split_at_pause(words, result, lo, hi, speakers[i], speakers[i + 1])
    return result


def _split_at_pause(
    words: Sequence[TimedWord], result: list[int | None], lo: int, hi: int, before: int, after: int
) -> None:
    """Give the words whose middles lie in ``[lo, hi)`` ``before`` up to the longest pause among them (the one
    nearest the middle of the zone among equals), ``after`` from it on."""
    inside = [i for i, w in enumerate(words) if lo <= (w.start + w.end) // 2 < hi]
    if not inside:
        return
    first, last = inside[0], inside[-1]
    # split k: words first..k-1 before, k..last after; the pause at split k is before word k
    # the longest pause wins; among equal pauses (none: words back to back), the split nearest the zone's middle
    middle = (lo + hi) // 2
    best_k, best_key = first, (-1, 0)
    for k in range(first, last + 2):
        left_end = words[k - 1].end if k > 0 else lo
        right_start = words[k].start if k < len(words) else hi
        key = (right_start - left_end, -abs((left_end + right_start) // 2 - middle))
        if key > best_key:
            best_k, best_key = k, key
    for i in range(first, last + 1):
        result[i] = before if i < best_k else after
