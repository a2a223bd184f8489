"""Speakers for a finished transcript (issue 40): ``streamer transcribe --diarize``. The whole recording goes through
the same :class:`~streamer.core.diarization.ChannelDiarizer` a live channel runs (its windows, tracker and word
assignment), with every segment handed in as one final once the audio is all in, so a word gets the speaker a
stream of the same audio would give it."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Protocol

import numpy as np
import numpy.typing as npt

from streamer.core.diarization import ChannelDiarizer, final_speaker
from streamer.core.events import Final, Word
from streamer.core.speakers import SpeakerOptions
from streamer.core.units import SAMPLE_RATE
from streamer.offline.transcribe import Transcript, TranscriptWord

__all__ = ["Embedder", "diarize_transcript", "join_turns", "speaker_pieces", "speaker_turns"]

# windows embedded per call (memory: 64 two-second windows are 8 MB of audio)
_BATCH = 64
# audio handed to the diarizer at a time: 60 s (about 80 windows)
_PIECE = 60 * SAMPLE_RATE


class Embedder(Protocol):
    def embed_windows(self, windows: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]: ...


def _samples(seconds: float) -> int:
    return round(seconds * SAMPLE_RATE)


def diarize_transcript(
    transcript: Transcript,
    samples: npt.NDArray[np.float32],
    encoder: Embedder,
    options: SpeakerOptions | None = None,
) -> Transcript:
    """``transcript`` of the 16 kHz ``samples`` with a speaker on every word and segment. A segment without word
    timestamps is labelled as one word spanning it (its words list stays empty)."""
    diarizer = ChannelDiarizer(options)

    def embed() -> None:
        requests = diarizer.windows_to_embed()
        for first in range(0, len(requests), _BATCH):
            batch = requests[first : first + _BATCH]
            diarizer.receive_embeddings(batch, encoder.embed_windows(np.stack([r.audio for r in batch])))

    # in pieces, each embedded before the next: a long recording holds a piece's windows at a time, not its own
    for start in range(0, len(samples), _PIECE):
        diarizer.receive_audio(samples[start : start + _PIECE])
        embed()
    diarizer.receive_end_of_stream()
    embed()
    finals = []
    for index, segment in enumerate(transcript.segments):
        timed = segment.words or (TranscriptWord(segment.text, segment.start, segment.end, 1.0),)
        words = tuple(Word(w.word, _samples(w.start), _samples(w.end), w.probability) for w in timed)
        finals.append(Final(index, segment.text, _samples(segment.start), _samples(segment.end), words, 0))
    diarizer.receive_events(finals)
    labelled = {e.segment_id: e for e in diarizer.events_received() if isinstance(e, Final)}
    segments = []
    for index, segment in enumerate(transcript.segments):
        final = labelled[index]
        if segment.words:
            labelled_words = tuple(
                replace(w, speaker=f.speaker) for w, f in zip(segment.words, final.words, strict=True)
            )
            segments.append(replace(segment, words=labelled_words, speaker=final_speaker(final.words)))
        else:
            segments.append(replace(segment, speaker=final.speaker))
    return replace(transcript, segments=tuple(segments))


def speaker_pieces(
    start: float, end: float, words: Sequence[tuple[float, float, int | None]], speaker: int | None = None
) -> list[tuple[float, float, int | None]]:
    """A transcript's span ``[start, end)`` (a final's or a segment's: the speech it accounts for, pauses and the
    fillers it wrote no word for included) shared among its labelled ``words`` (start, end, speaker): cut where one
    speaker's word is followed by another's, halfway through the pause between them. A span with no labelled word is
    one piece of ``speaker`` (None: unlabelled)."""
    labelled = [w for w in words if w[2] is not None]
    if not labelled:
        return [(start, end, speaker)]
    pieces: list[tuple[float, float, int | None]] = []
    cut = start
    for before, after in itertools.pairwise(labelled):
        if before[2] != after[2]:
            middle = min(end, max(cut, (before[1] + after[0]) / 2))
            pieces.append((cut, middle, before[2]))
            cut = middle
    pieces.append((cut, end, labelled[-1][2]))
    return [piece for piece in pieces if piece[1] > piece[0]]


def join_turns(pieces: Iterable[tuple[float, float, int | None]], gap: float = 0.5) -> list[tuple[float, float, int]]:
    """(start, end, speaker) turns of timed ``pieces`` in order: a speaker's consecutive pieces less than ``gap``
    apart make one turn. A piece without a speaker (a filler the diarizer had no window for) belongs to the turn it
    follows within ``gap``, else to the one that starts within ``gap`` after it; alone, it is left out."""
    spans: list[tuple[float, float, int]] = []
    waiting: tuple[float, float] | None = None  # an unlabelled piece the next turn may take
    for start, end, speaker in pieces:
        if speaker is None:
            if spans and start - spans[-1][1] < gap:
                spans[-1] = (spans[-1][0], max(spans[-1][1], end), spans[-1][2])
            elif waiting is not None and start - waiting[1] < gap:
                waiting = (waiting[0], max(waiting[1], end))
            else:
                waiting = (start, end)
            continue
        if waiting is not None and start - waiting[1] < gap:
            start = min(start, waiting[0])
        waiting = None
        if spans and spans[-1][2] == speaker and start - spans[-1][1] < gap:
            spans[-1] = (spans[-1][0], max(spans[-1][1], end), speaker)
        else:
            spans.append((start, end, speaker))
    return spans


def speaker_turns(transcript: Transcript, gap: float = 0.5) -> list[tuple[float, float, int]]:
    """(start, end, speaker) turns: each segment's span shared among its words' speakers (:func:`speaker_pieces`;
    a segment without word times is its own speaker's), then a speaker's consecutive pieces less than ``gap`` seconds
    apart joined into one turn (:func:`join_turns`). Spans rather than words: a turn holds its pauses and fillers, as
    the references diarization is scored against do (words alone missed 23 % of a real conversation's speech)."""
    return join_turns(
        (
            piece
            for segment in transcript.segments
            for piece in speaker_pieces(
                segment.start, segment.end, [(w.start, w.end, w.speaker) for w in segment.words], segment.speaker
            )
        ),
        gap,
    )
