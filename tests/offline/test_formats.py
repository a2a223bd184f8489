from __future__ import annotations

import json

import pytest

from streamer.offline.formats import OutputFormat, format_timestamp, render, to_srt, to_vtt, transcript_to_dict
from streamer.offline.transcribe import Segment, Transcript, TranscriptWord

TRANSCRIPT = Transcript(
    text="Hello there. General Kenobi --> again.",
    language="en",
    duration=3725.5,
    segments=(
        Segment(
            0.0,
            2.5,
            "Hello there.",
            (TranscriptWord(" Hello", 0.0, 0.4, 0.91234), TranscriptWord(" there.", 0.5, 2.5, 0.8)),
        ),
        Segment(3661.0014, 3662.9996, "General Kenobi --> again.", ()),
        Segment(3663.0, 3663.5, "", ()),
    ),
)


@pytest.mark.parametrize(
    ("seconds", "marker", "expected"),
    [
        (0.0, ",", "00:00:00,000"),
        (1.5, ",", "00:00:01,500"),
        (59.9996, ".", "00:01:00.000"),
        (3661.0014, ".", "01:01:01.001"),
        (36000.25, ",", "10:00:00,250"),
        (-0.2, ".", "00:00:00.000"),
    ],
)
def test_timestamps(seconds: float, marker: str, expected: str) -> None:
    assert format_timestamp(seconds, decimal_marker=marker) == expected


def test_srt() -> None:
    assert to_srt(TRANSCRIPT) == (
        "1\n00:00:00,000 --> 00:00:02,500\nHello there.\n\n2\n01:01:01,001 --> 01:01:03,000\nGeneral Kenobi -> again.\n"
    )


def test_vtt() -> None:
    assert to_vtt(TRANSCRIPT) == (
        "WEBVTT\n"
        "\n"
        "00:00:00.000 --> 00:00:02.500\nHello there.\n"
        "\n"
        "01:01:01.001 --> 01:01:03.000\nGeneral Kenobi -> again.\n"
    )


def test_json_is_one_line_with_the_documented_fields() -> None:
    line = render(TRANSCRIPT, OutputFormat.JSON, file="a.wav")
    assert line.endswith("\n") and line.count("\n") == 1
    document = json.loads(line)
    assert list(document) == ["file", "text", "language", "duration", "segments"]
    assert document["file"] == "a.wav" and document["duration"] == 3725.5
    first = document["segments"][0]
    assert first == {
        "start": 0.0,
        "end": 2.5,
        "text": "Hello there.",
        "words": [
            {"word": " Hello", "start": 0.0, "end": 0.4, "probability": 0.9123},
            {"word": " there.", "start": 0.5, "end": 2.5, "probability": 0.8},
        ],
    }
    assert document["segments"][1]["start"] == 3661.001


def test_json_without_a_file_name() -> None:
    assert "file" not in transcript_to_dict(TRANSCRIPT)


def test_text_is_the_transcript_on_one_line() -> None:
    assert render(TRANSCRIPT, OutputFormat.TEXT) == TRANSCRIPT.text + "\n"


def test_empty_transcript_gives_valid_documents() -> None:
    empty = Transcript(text="", language="en", duration=1.0, segments=())
    assert to_srt(empty) == ""
    assert to_vtt(empty) == "WEBVTT\n"
    assert json.loads(render(empty, OutputFormat.JSON))["segments"] == []


DIARIZED = Transcript(
    text="Hello there. General Kenobi.",
    language="en",
    duration=6.0,
    segments=(
        Segment(
            0.0,
            2.5,
            "Hello there.",
            (TranscriptWord(" Hello", 0.0, 0.4, 0.9, 0), TranscriptWord(" there.", 0.5, 2.5, 0.8, 0)),
            speaker=0,
        ),
        Segment(
            3.0,
            5.0,
            "General Kenobi.",
            (TranscriptWord(" General", 3.0, 3.6, 0.9, 1), TranscriptWord(" Kenobi.", 3.7, 5.0, 0.9, 1)),
            speaker=1,
        ),
    ),
)


def test_a_diarized_transcript_names_its_speakers_in_every_format() -> None:
    assert "1\n00:00:00,000 --> 00:00:02,500\nSpeaker 1: Hello there.\n" in to_srt(DIARIZED)
    assert "00:00:03.000 --> 00:00:05.000\n<v Speaker 2>General Kenobi.\n" in to_vtt(DIARIZED)
    document = json.loads(render(DIARIZED, OutputFormat.JSON, file="talk.wav"))
    assert [s["speaker"] for s in document["segments"]] == [0, 1]
    assert [w["speaker"] for s in document["segments"] for w in s["words"]] == [0, 0, 1, 1]
    assert render(DIARIZED, OutputFormat.RTTM, file="recordings/the talk.wav").splitlines() == [
        "SPEAKER the_talk 1 0.000 2.500 <NA> <NA> speaker_0 <NA> <NA>",
        "SPEAKER the_talk 1 3.000 2.000 <NA> <NA> speaker_1 <NA> <NA>",
    ]
    # a transcript without speakers reads as before: no speaker fields, no turns
    assert "speaker" not in render(TRANSCRIPT, OutputFormat.JSON) and render(TRANSCRIPT, OutputFormat.RTTM) == ""
