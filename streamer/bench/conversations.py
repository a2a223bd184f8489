"""Synthetic conversations from the LibriSpeech speakers of the shared data, with who-spoke-when ground truth
(issue 40).

A conversation is 2 to 4 LibriSpeech readers taking turns, each turn one whole utterance of theirs (never the same
utterance twice in a conversation), the next speaker always a different one; between turns a gap drawn uniformly
from 0.15 to 0.9 s, and now and then (``overlap_probability``) a short overlap instead: the next turn starts 0.2 to
0.8 s before the previous ends, the two voices summed. It ends at ``target_seconds`` or when the speakers run out of
utterances. Everything comes from a seeded :class:`random.Random`: the same seed, the same conversation.

The ground truth is RTTM-like (:class:`Turn`: a speaker's span, NIST RTTM's SPEAKER lines, :meth:`Conversation.rttm`)
plus the reference words of each turn. LibriSpeech has no word timings here: a turn's words are laid over its voiced
extent (its first to last 10 ms frame within 40 dB of its loudest) in proportion to their letters
(:func:`spread_words`), close enough to say which side of a turn change a word is on, the question word attribution
asks; a word's exact edges are not.

The speakers are split into a tuning half and a report half by :func:`streamer.bench.evalset.assign_halves` over
their seconds in ``utterances.tsv`` (:func:`speaker_halves`): defaults are chosen on conversations of the first and
reported on conversations of the second; no conversation mixes halves.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from streamer.bench.evalset import HALVES, assign_halves, read_table
from streamer.bench.harness import DATA, AudioArray
from streamer.core.errors import ConfigError
from streamer.core.units import SAMPLE_RATE

__all__ = [
    "Conversation",
    "ConversationOptions",
    "PlannedTurn",
    "ReferenceWord",
    "SourceUtterance",
    "Turn",
    "build_conversation",
    "build_conversations",
    "plan_conversation",
    "read_textgrid",
    "read_utterances",
    "real_conversations",
    "speaker_halves",
    "spread_words",
    "voiced_extent",
]

LIBRISPEECH = DATA / "librispeech"
_FRAME = SAMPLE_RATE // 100  # 10 ms frames for the voiced extent
_VOICED_DB = 40.0  # a frame within this of the loudest frame is voiced


@dataclass(frozen=True)
class SourceUtterance:
    """One LibriSpeech utterance of ``utterances.tsv``."""

    utt_id: str
    speaker: str  # LibriSpeech's reader id
    file: str  # relative to the librispeech folder
    seconds: float
    transcript: str


@dataclass(frozen=True)
class ConversationOptions:
    """The shape of a synthetic conversation (issue 40's: 2-4 speakers, gaps of 0.15-0.9 s, a few short overlaps)."""

    min_speakers: int = 2
    max_speakers: int = 4
    target_seconds: float = 60.0  # stop adding turns once the conversation is this long
    min_gap_s: float = 0.15
    max_gap_s: float = 0.9
    overlap_probability: float = 0.1  # each turn after the first overlaps the one before with this chance ...
    min_overlap_s: float = 0.2  # ... by this ...
    max_overlap_s: float = 0.8  # ... to this

    def validate(self) -> None:
        if not 1 <= self.min_speakers <= self.max_speakers <= 8:
            raise ConfigError("conversation speakers must satisfy 1 <= min_speakers <= max_speakers <= 8")
        if not 0 <= self.min_gap_s <= self.max_gap_s:
            raise ConfigError("conversation gaps must satisfy 0 <= min_gap_s <= max_gap_s")
        if not 0 <= self.overlap_probability <= 1 or not 0 <= self.min_overlap_s <= self.max_overlap_s:
            raise ConfigError("conversation overlaps: probability in 0..1, 0 <= min_overlap_s <= max_overlap_s")


@dataclass(frozen=True)
class PlannedTurn:
    """A turn before audio is loaded: whose utterance, and its offset from the previous turn's end (negative: an
    overlap)."""

    utterance: SourceUtterance
    offset_s: float


@dataclass(frozen=True)
class ReferenceWord:
    """A reference word at its (spread) stream time, with its speaker."""

    start: int
    end: int
    text: str
    speaker: str


@dataclass(frozen=True)
class Turn:
    """A speaker's turn, ``[start, end)`` samples of the conversation: an RTTM SPEAKER line."""

    speaker: str
    start: int
    end: int
    utt_id: str
    words: tuple[ReferenceWord, ...]


@dataclass(frozen=True)
class Conversation:
    name: str
    samples: AudioArray
    turns: tuple[Turn, ...]
    half: str

    @property
    def speakers(self) -> tuple[str, ...]:
        """The speakers in order of first appearance."""
        return tuple(dict.fromkeys(t.speaker for t in self.turns))

    @property
    def words(self) -> list[ReferenceWord]:
        return sorted((w for t in self.turns for w in t.words), key=lambda w: (w.start, w.end))

    @property
    def seconds(self) -> float:
        return len(self.samples) / SAMPLE_RATE

    def rttm(self) -> str:
        """The ground truth as NIST RTTM SPEAKER lines (``SPEAKER file 1 onset duration <NA> <NA> name <NA> <NA>``)."""
        return "".join(
            f"SPEAKER {self.name} 1 {t.start / SAMPLE_RATE:.3f} {(t.end - t.start) / SAMPLE_RATE:.3f} "
            f"<NA> <NA> {t.speaker} <NA> <NA>\n"
            for t in self.turns
        )


def read_utterances(data: Path = DATA) -> list[SourceUtterance]:
    """Every utterance of ``librispeech/utterances.tsv``, in id order."""
    path = data / "librispeech" / "utterances.tsv"
    if not path.is_file():
        raise ConfigError(f"{path}: no LibriSpeech utterance table")
    rows = read_table(path)
    return sorted(
        (SourceUtterance(r["utt_id"], r["speaker"], r["file"], float(r["duration_s"]), r["transcript"]) for r in rows),
        key=lambda u: u.utt_id,
    )


def speaker_halves(utterances: Sequence[SourceUtterance]) -> dict[str, str]:
    """Each reader's half (:data:`~streamer.bench.evalset.HALVES`) by their seconds of speech, the evaluation set's
    rule (:func:`~streamer.bench.evalset.assign_halves`) over the LibriSpeech readers alone."""
    seconds: dict[str, float] = {}
    for u in utterances:
        seconds[u.speaker] = seconds.get(u.speaker, 0.0) + u.seconds
    return assign_halves({speaker: ("librispeech", length) for speaker, length in seconds.items()})


def plan_conversation(
    pool: Sequence[SourceUtterance], rng: random.Random, options: ConversationOptions | None = None
) -> list[PlannedTurn]:
    """The turns of one conversation among the speakers of ``pool`` (their utterances): 2 to 4 of them drawn at
    random (those with the most utterances are not favoured), turns of unused utterances, each by a speaker other
    than the last, until ``target_seconds`` or no other speaker has an utterance left."""
    options = options if options is not None else ConversationOptions()
    options.validate()
    by_speaker: dict[str, list[SourceUtterance]] = {}
    for u in pool:
        by_speaker.setdefault(u.speaker, []).append(u)
    names = sorted(by_speaker, key=int)
    if len(names) < options.min_speakers:
        raise ConfigError(f"{len(names)} speakers cannot make a conversation of {options.min_speakers}")
    count = rng.randint(options.min_speakers, min(options.max_speakers, len(names)))
    chosen = rng.sample(names, count)
    left = {s: rng.sample(by_speaker[s], len(by_speaker[s])) for s in chosen}
    turns: list[PlannedTurn] = []
    seconds, last = 0.0, None
    # every chosen speaker speaks once before anyone speaks twice, so the conversation has its speaker count
    order = rng.sample(chosen, count)
    while seconds < options.target_seconds:
        candidates = [s for s in chosen if s != last and left[s]]
        if not candidates:
            break
        speaker = order.pop(0) if order else rng.choice(candidates)
        utterance = left[speaker].pop()
        if not turns:
            offset = 0.0
        elif rng.random() < options.overlap_probability:
            offset = -rng.uniform(options.min_overlap_s, min(options.max_overlap_s, turns[-1].utterance.seconds / 2))
        else:
            offset = rng.uniform(options.min_gap_s, options.max_gap_s)
        turns.append(PlannedTurn(utterance, offset))
        seconds += offset + utterance.seconds
        last = speaker
    return turns


def voiced_extent(samples: AudioArray) -> tuple[int, int]:
    """``[start, end)`` of ``samples`` from the first to the last 10 ms frame within 40 dB of the loudest frame."""
    frames = len(samples) // _FRAME
    if frames == 0:
        return 0, len(samples)
    energy = np.square(samples[: frames * _FRAME].astype(np.float64)).reshape(frames, _FRAME).mean(axis=1)
    voiced = np.flatnonzero(energy >= energy.max() * 10.0 ** (-_VOICED_DB / 10.0))
    return int(voiced[0]) * _FRAME, (int(voiced[-1]) + 1) * _FRAME


def spread_words(text: str, start: int, end: int, speaker: str) -> tuple[ReferenceWord, ...]:
    """The words of ``text`` laid over ``[start, end)`` in proportion to their letters, a letter's share of a space
    between words."""
    tokens = text.split()
    if not tokens:
        return ()
    weights = np.array([len(t) for t in tokens], dtype=np.float64)
    gaps = np.array([0.0] + [1.0] * (len(tokens) - 1))
    edges = np.cumsum(np.stack([gaps, weights], axis=1).reshape(-1))  # [gap0, word0, gap1, word1, ...] cumulative
    scale = (end - start) / edges[-1]
    words = []
    for i, token in enumerate(tokens):
        w_start = start + round(edges[2 * i] * scale)
        w_end = start + round(edges[2 * i + 1] * scale)
        words.append(ReferenceWord(w_start, max(w_end, w_start + 1), token, speaker))
    return tuple(words)


def build_conversation(name: str, plan: Sequence[PlannedTurn], half: str, data: Path = DATA) -> Conversation:
    """The audio and ground truth of ``plan``: each utterance loaded, its voice placed its offset after the previous
    turn's voice ends (a negative offset: before), overlapping audio summed."""
    import soundfile as sf

    clips: list[AudioArray] = []
    for planned in plan:
        samples, rate = sf.read(data / "librispeech" / planned.utterance.file, dtype="float32")
        if rate != SAMPLE_RATE:
            raise ConfigError(f"{planned.utterance.file}: {rate} Hz, not {SAMPLE_RATE}")
        clips.append(np.asarray(samples, dtype=np.float32))
    # turns are placed by their voiced extents: a gap or overlap is between one voice's end and the next's start
    extents = [voiced_extent(clip) for clip in clips]
    starts: list[int] = []
    voice_end = 0
    for planned, (lo, hi) in zip(plan, extents, strict=True):
        voice_start = voice_end + round(planned.offset_s * SAMPLE_RATE) if starts else lo
        start = max(0, voice_start - lo)
        starts.append(start)
        voice_end = start + hi
    mix = np.zeros(max(s + len(c) for s, c in zip(starts, clips, strict=True)), dtype=np.float32)
    turns = []
    for planned, clip, start, (lo, hi) in zip(plan, clips, starts, extents, strict=True):
        mix[start : start + len(clip)] += clip
        speaker = planned.utterance.speaker
        words = spread_words(planned.utterance.transcript, start + lo, start + hi, speaker)
        turns.append(Turn(speaker, start + lo, start + hi, planned.utterance.utt_id, words))
    return Conversation(name, mix, tuple(turns), half)


def build_conversations(
    half: str, count: int, seed: int = 0, data: Path = DATA, options: ConversationOptions | None = None
) -> list[Conversation]:
    """``count`` conversations among the speakers of ``half`` (seeded: conversation ``i`` of a seed is always the
    same)."""
    if half not in HALVES:
        raise ConfigError(f"unknown half {half!r}: use {', '.join(HALVES)}")
    utterances = read_utterances(data)
    halves = speaker_halves(utterances)
    pool = [u for u in utterances if halves[u.speaker] == half]
    conversations = []
    for i in range(count):
        rng = random.Random(f"{seed}:{half}:{i}")
        plan = plan_conversation(pool, rng, options)
        conversations.append(build_conversation(f"{half}-{seed}-{i}", plan, half, data))
    return conversations


# the shared recordings with speaker timings (a Praat TextGrid beside the audio, one tier per speaker); nobody tuned
# on them, so they belong to the report half
REAL_CONVERSATIONS = ("michaelandsickmichael",)


def read_textgrid(text: str) -> list[Turn]:
    """The turns of a Praat TextGrid (long text format): a turn per interval with text, its tier's name the
    speaker, its words spread over it (:func:`spread_words`)."""
    turns = []
    for tier in re.split(r"item \[\d+\]:", text)[1:]:
        found = re.search(r'name = "([^"]+)"', tier)
        speaker = found.group(1) if found else "?"
        for xmin, xmax, words in re.findall(r'xmin = ([\d.]+)\s+xmax = ([\d.]+)\s+text = "([^"]*)"', tier, re.S):
            if words.strip():
                start, end = round(float(xmin) * SAMPLE_RATE), round(float(xmax) * SAMPLE_RATE)
                spread = spread_words(" ".join(words.split()), start, end, speaker)
                turns.append(Turn(speaker, start, end, f"{speaker}-{start}", spread))
    return sorted(turns, key=lambda t: (t.start, t.end))


def real_conversations(data: Path = DATA) -> list[Conversation]:
    """The shared conversations with speaker timings (:data:`REAL_CONVERSATIONS`), their channels mixed to mono
    (each has one talker per channel), their turns from the TextGrid beside them; the report half's."""
    import soundfile as sf

    conversations = []
    for name in REAL_CONVERSATIONS:
        folder = data / "conversation"
        audio, rate = sf.read(folder / f"{name}.wav", dtype="float32", always_2d=True)
        if rate != SAMPLE_RATE:
            raise ConfigError(f"{name}.wav: {rate} Hz, not {SAMPLE_RATE}")
        mono = np.asarray(audio.mean(axis=1), dtype=np.float32)
        turns = read_textgrid((folder / f"{name}.TextGrid").read_text())
        conversations.append(Conversation(f"{name} (mono)", mono, tuple(turns), "report"))
    return conversations
