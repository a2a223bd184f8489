"""Transcript writers: plain text, JSON lines, SubRip (SRT) and WebVTT.

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
    "to_json",
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
                    for word in segment.words
                ],
            }
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


def to_srt(transcript: Transcript) -> str:
    """SubRip: numbered cues, ``HH:MM:SS,mmm --> HH:MM:SS,mmm``, a blank line after each."""
    cues = []
    for number, segment in enumerate((s for s in transcript.segments if s.text.strip()), start=1):
        start = format_timestamp(segment.start, decimal_marker=",")
        end = format_timestamp(segment.end, decimal_marker=",")
        cues.append(f"{number}\n{start} --> {end}\n{_cue_text(segment)}\n")
    return "\n".join(cues)


def to_vtt(transcript: Transcript) -> str:
    """WebVTT: the ``WEBVTT`` header, then ``HH:MM:SS.mmm --> HH:MM:SS.mmm`` cues separated by blank lines."""
    cues = ["WEBVTT\n"]
    for segment in transcript.segments:
        if segment.text.strip():
            start, end = format_timestamp(segment.start), format_timestamp(segment.end)
            cues.append(f"{start} --> {end}\n{_cue_text(segment)}\n")
    return "\n".join(cues)


def render(transcript: Transcript, output_format: OutputFormat, *, file: str | None = None) -> str:
    """The whole document in ``output_format``; ``file`` is named in JSON output only."""
    if output_format is OutputFormat.JSON:
        return to_json(transcript, file=file)
    if output_format is OutputFormat.SRT:
        return to_srt(transcript)
    if output_format is OutputFormat.VTT:
        return to_vtt(transcript)
    return to_text(transcript)
