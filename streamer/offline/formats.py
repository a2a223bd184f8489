"""Transcript writers: plain text, JSON lines, SubRip (SRT), WebVTT, and RTTM for a diarized transcript.

Call :func:`render` with a finished :class:`~streamer.offline.transcribe.Transcript`; it returns the whole document as a
string, ending in a newline, for the caller to print or write to a file.
"""

from __future__ import annotations

import json
from enum import StrEnum
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from streamer.offline.transcribe import Segment, Transcript

__all__ = [
    "OutputFormat",
    "format_timestamp",
    "render",
    "speaker_name",
    "to_json",
    "to_rttm",
    "to_srt",
    "to_text",
    "to_vtt",
    "transcript_to_dict",
]


class OutputFormat(StrEnum):
    TEXT = "text"
    JSON = "json"
    SRT = "srt"
    VTT = "vtt"
    RTTM = "rttm"  # speaker turns (needs --diarize)


def format_timestamp(seconds: float, *, decimal_marker: str = ".") -> str:
    """``HH:MM:SS.mmm`` (``,`` as the marker for SRT), rounded to the millisecond; negative times clamp to 0."""
    milliseconds = max(0, round(seconds * 1000))
    hours, milliseconds = divmod(milliseconds, 3_600_000)
    minutes, milliseconds = divmod(milliseconds, 60_000)
    whole, milliseconds = divmod(milliseconds, 1000)
    return f"{hours:02d}:{minutes:02d}:{whole:02d}{decimal_marker}{milliseconds:03d}"


def _rounded(seconds: float) -> float:
    return round(seconds, 3)


def transcript_to_dict(transcript: Transcript, *, file: str | None = None) -> dict[str, Any]:
    """The JSON shape: ``file``, ``text``, ``language``, ``duration`` and ``segments`` with their ``words``."""
    document: dict[str, Any] = {} if file is None else {"file": file}
    document.update(
        text=transcript.text,
        language=transcript.language,
        duration=_rounded(transcript.duration),
        segments=[
            {
                "start": _rounded(segment.start),
                "end": _rounded(segment.end),
                "text": segment.text,
                "words": [
                    {
                        "word": word.word,
                        "start": _rounded(word.start),
                        "end": _rounded(word.end),
                        "probability": round(word.probability, 4),
                    }
                    | ({} if word.speaker is None else {"speaker": word.speaker})
                    for word in segment.words
                ],
            }
            | ({} if segment.speaker is None else {"speaker": segment.speaker})
            for segment in transcript.segments
        ],
    )
    return document


def to_text(transcript: Transcript) -> str:
    """The transcript's text on one line."""
    return transcript.text + "\n"


def to_json(transcript: Transcript, *, file: str | None = None) -> str:
    """One JSON object on one line (JSON lines: several files give several lines)."""
    return json.dumps(transcript_to_dict(transcript, file=file), ensure_ascii=False) + "\n"


def _cue_text(segment: Segment) -> str:
    # A cue ends at its first blank line, and "-->" in a cue's text would read as a timing line (WebVTT 4.1).
    return " ".join(segment.text.split()).replace("-->", "->")


def speaker_name(speaker: int) -> str:
    """How a diarized cue names its speaker: "Speaker 1" for the first (label 0)."""
    return f"Speaker {speaker + 1}"


def to_srt(transcript: Transcript) -> str:
    """SubRip: numbered cues, ``HH:MM:SS,mmm --> HH:MM:SS,mmm``, a blank line after each."""
    cues = []
    for number, segment in enumerate((s for s in transcript.segments if s.text.strip()), start=1):
        start = format_timestamp(segment.start, decimal_marker=",")
        end = format_timestamp(segment.end, decimal_marker=",")
        who = "" if segment.speaker is None else f"{speaker_name(segment.speaker)}: "
        cues.append(f"{number}\n{start} --> {end}\n{who}{_cue_text(segment)}\n")
    return "\n".join(cues)


def to_vtt(transcript: Transcript) -> str:
    """WebVTT: the ``WEBVTT`` header, then ``HH:MM:SS.mmm --> HH:MM:SS.mmm`` cues separated by blank lines."""
    cues = ["WEBVTT\n"]
    for segment in transcript.segments:
        if segment.text.strip():
            start, end = format_timestamp(segment.start), format_timestamp(segment.end)
            text = _cue_text(segment)
            if segment.speaker is not None:  # a voice span (WebVTT 4.2.2)
                text = f"<v {speaker_name(segment.speaker)}>{text}"
            cues.append(f"{start} --> {end}\n{text}\n")
    return "\n".join(cues)


def to_rttm(transcript: Transcript, *, file: str | None = None) -> str:
    """RTTM (NIST's Rich Transcription Time Marked, what diarization scorers such as pyannote.metrics and dscore
    read): one ``SPEAKER <file> 1 <start> <duration> <NA> <NA> <speaker> <NA> <NA>`` line per turn: each segment's
    span shared among its words' speakers, a speaker's pieces less than 0.5 s apart making one turn
    (:func:`~streamer.offline.speakers.speaker_turns`). ``file`` names the recording (its stem; ``audio`` without
    one)."""
    from pathlib import Path

    from streamer.offline.speakers import speaker_turns

    name = "audio" if file is None else (Path(file).stem.replace(" ", "_") or "audio")
    lines = [
        f"SPEAKER {name} 1 {start:.3f} {max(0.0, end - start):.3f} <NA> <NA> speaker_{speaker} <NA> <NA>\n"
        for start, end, speaker in speaker_turns(transcript)
    ]
    return "".join(lines)


def render(transcript: Transcript, output_format: OutputFormat, *, file: str | None = None) -> str:
    """The whole document in ``output_format``; ``file`` is named in JSON and RTTM output only."""
    if output_format is OutputFormat.RTTM:
        return to_rttm(transcript, file=file)
    if output_format is OutputFormat.JSON:
        return to_json(transcript, file=file)
    if output_format is OutputFormat.SRT:
        return to_srt(transcript)
    if output_format is OutputFormat.VTT:
        return to_vtt(transcript)
    return to_text(transcript)
