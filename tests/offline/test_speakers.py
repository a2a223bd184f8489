from __future__ import annotations

import itertools

import numpy as np

from streamer.offline.formats import OutputFormat, render
from streamer.offline.speakers import diarize_transcript, speaker_pieces, speaker_turns
from streamer.offline.transcribe import Segment, Transcript, TranscriptWord
from tests.server.test_speaker_worker import AUDIO, B_STARTS

RATE = 16000


def two_readers() -> tuple[np.ndarray, Transcript]:
    audio = AUDIO.copy()
    audio[B_STARTS:] *= 0.3  # B quieter: what the stand-in tells them apart by
    segments = []
    for start, end in ((0.2, 10.0), (B_STARTS / RATE + 0.2, len(AUDIO) / RATE - 1.2)):
        edges = np.linspace(start, end, 9)
        words = tuple(
            TranscriptWord(f" w{i}", float(a), float(b), 0.9) for i, (a, b) in enumerate(itertools.pairwise(edges))
        )
        segments.append(Segment(start, end, " ".join(w.word.strip() for w in words), words))
    return audio, Transcript(" ".join(s.text for s in segments), "en", len(audio) / RATE, tuple(segments))


class Loudness:
    """A stand-in voice encoder: here reader B is a third as loud as A, which it tells them apart by (the real
    encoder's accuracy is tests/bench/test_speakers.py's)."""

    def __init__(self, threshold: float) -> None:
        self.threshold = threshold

    def embed_windows(self, windows: np.ndarray) -> np.ndarray:
        loud = np.sqrt(np.mean(windows**2, axis=1)) > self.threshold
        return np.stack([loud, ~loud], axis=1).astype(np.float32)


def loudness(audio: np.ndarray) -> Loudness:
    """The stand-in, its threshold halfway between the readers' loudness (speech only)."""
    a = np.sqrt(np.mean(audio[: B_STARTS - RATE] ** 2))
    b = np.sqrt(np.mean(audio[B_STARTS:] ** 2))
    return Loudness(float(np.sqrt(a * b)) * 0.8)


def test_every_word_and_segment_gets_its_reader_and_the_turns_follow() -> None:
    audio, transcript = two_readers()
    diarized = diarize_transcript(transcript, audio, loudness(audio))
    assert [s.speaker for s in diarized.segments] == [0, 1]
    assert [w.speaker for w in diarized.segments[0].words] == [0] * 8
    assert [w.speaker for w in diarized.segments[1].words] == [1] * 8
    turns = speaker_turns(diarized)
    assert [speaker for _, _, speaker in turns] == [0, 1]
    assert len(render(diarized, OutputFormat.RTTM, file="two.wav").splitlines()) == 2


def test_segments_without_word_times_are_labelled_whole() -> None:
    audio, transcript = two_readers()
    bare = Transcript(
        transcript.text,
        "en",
        transcript.duration,
        tuple(Segment(s.start, s.end, s.text, ()) for s in transcript.segments),
    )
    diarized = diarize_transcript(bare, audio, loudness(audio))
    assert [s.speaker for s in diarized.segments] == [0, 1] and all(not s.words for s in diarized.segments)


def test_a_turn_holds_its_segment_s_pauses_and_a_change_of_speaker_cuts_it_between_words() -> None:
    """RTTM turns are segments' spans (the speech they account for), not their words: the pause inside a segment and
    its edges stay in the turn, a change of speaker cuts the segment halfway through the pause between the two
    speakers' words, and a segment with no words is its own speaker's."""
    words = (
        TranscriptWord(" a", 1.2, 1.5, 0.9, speaker=0),
        TranscriptWord(" b", 2.5, 2.8, 0.9, speaker=0),  # 1 s pause: still the same turn
        TranscriptWord(" c", 3.2, 3.6, 0.9, speaker=1),  # cut at 3.0
    )
    transcript = Transcript(
        "a b c uh",
        "en",
        6.0,
        (Segment(1.0, 4.0, "a b c", words, speaker=0), Segment(4.2, 5.0, "uh", (), speaker=1)),
    )
    assert speaker_turns(transcript) == [(1.0, 3.0, 0), (3.0, 5.0, 1)]
    assert speaker_pieces(0.0, 1.0, [(0.1, 0.2, None)]) == [(0.0, 1.0, None)]
