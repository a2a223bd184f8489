"""Speakers for a finished transcript (issue 40): ``streamer transcribe --diarize``. The whole recording goes through
the same :class:`~streamer.core.diarization.ChannelDiarizer` a live channel runs (its windows, tracker and word
assignment), with every segment handed in as one final once the audio is all in, so a word gets the speaker a
stream of the same audio would give it."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from typing import Protocol

import numpy as np
import numpy.typing as npt

from streamer.core.diarization import ChannelDiarizer, final_speaker
from streamer.core.events import Final, Word
from streamer.core.speakers import SpeakerOptions
from streamer.core.units import SAMPLE_RATE
from streamer.offline.transcribe import Transcript, TranscriptWord

__all__ = ["Embedder", "diarize_transcript", "join_turns", "speaker_turns"]

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


def join_turns(pieces: Iterable[tuple[float, float, int | None]], gap: float = 0.5) -> list[tuple[float, float, int]]:
    """(start, end, speaker) turns of timed ``pieces`` in order: a speaker's consecutive pieces less than ``gap``
    apart make one turn; pieces without a speaker are left out."""
    spans: list[tuple[float, float, int]] = []
    for start, end, speaker in pieces:
        if speaker is None:
            continue
        if spans and spans[-1][2] == speaker and start - spans[-1][1] < gap:
            spans[-1] = (spans[-1][0], max(spans[-1][1], end), speaker)
        else:
            spans.append((start, end, speaker))
    return spans


def speaker_turns(transcript: Transcript, gap: float = 0.5) -> list[tuple[float, float, int]]:
    """(start, end, speaker) turns: a speaker's consecutive words less than ``gap`` seconds apart make one turn
    (whole segments where there are no word times)."""
    return join_turns(
        (
            piece
            for segment in transcript.segments
            for piece in (
                [(w.start, w.end, w.speaker) for w in segment.words] or [(segment.start, segment.end, segment.speaker)]
            )
        ),
        gap,
    )
