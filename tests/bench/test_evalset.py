"""The evaluation set's split by speaker (issue 39): every stream names its speaker, the speakers fall into a tuning
half and a report half, evenly per group, and no speaker is in both."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import pytest

from streamer.bench.evalset import HALVES, assign_halves, build_set, speaker_of_utterance
from streamer.core.errors import ConfigError


def test_a_source_utterance_names_its_speaker() -> None:
    assert speaker_of_utterance("1688-142285-0003") == "librispeech:1688"
    assert speaker_of_utterance("LJ001-0017") == "ljspeech"
    assert speaker_of_utterance("sonnet-1") is None


def test_speakers_are_split_evenly_within_each_group_longest_first() -> None:
    seconds = {
        "a": ("read", 60.0),
        "b": ("read", 60.0),
        "c": ("read", 50.0),
        "d": ("read", 40.0),
        "e": ("phone", 30.0),
        "f": ("phone", 10.0),
        "g": ("phone", 10.0),
    }
    halves = assign_halves(seconds)
    assert set(halves) == set(seconds) and set(halves.values()) == set(HALVES)
    per: dict[tuple[str, str], float] = defaultdict(float)
    for speaker, (group, length) in seconds.items():
        per[(group, halves[speaker])] += length
    # as even as whole speakers allow: 110 against 100 read, 30 against 20 on the phone
    assert sorted(per[("read", h)] for h in HALVES) == [100.0, 110.0]
    assert sorted(per[("phone", h)] for h in HALVES) == [20.0, 30.0]
    # the same speakers in another order split the same way
    assert assign_halves(dict(reversed(list(seconds.items())))) == halves


def test_the_shared_set_splits_by_speaker_and_a_selection_keeps_each_streams_half(shared_data: Path) -> None:
    streams = build_set(data=shared_data)
    assert all(s.speaker and s.half in HALVES for s in streams)
    # a speaker is in one half only, wherever their voice appears (reader 61 reads in LibriSpeech and on the left
    # channel of the stereo conversation; the telephone talker's two Harvard lists stay together)
    half_of: dict[str, set[str]] = defaultdict(set)
    for s in streams:
        half_of[s.speaker].add(s.half)
    assert all(len(h) == 1 for h in half_of.values())
    by_name = {s.name: s for s in streams}
    assert by_name["conversation/stereo_diarization.wav [left]"].speaker == "librispeech:61"
    assert (
        by_name["librispeech/test-clean-61-joined"].half == by_name["conversation/stereo_diarization.wav [left]"].half
    )
    assert by_name["telephony/OSR_us_000_0010_8k.wav"].half == by_name["telephony/OSR_us_000_0011_8k.wav"].half
    assert by_name["longform/librispeech_test-other_1688-142285_0000_to_0009_concat.flac"].speaker == "librispeech:1688"
    # each group has speakers in both halves, its halves apart by no more than its longest speaker's audio
    for group in {s.group for s in streams}:
        seconds = {h: sum(s.seconds for s in streams if s.group == group and s.half == h) for h in HALVES}
        per_speaker: dict[str, float] = defaultdict(float)
        for s in streams:
            if s.group == group:
                per_speaker[s.speaker] += s.seconds
        assert min(seconds.values()) > 0, (group, seconds)
        assert abs(seconds["tune"] - seconds["report"]) <= max(per_speaker.values()), (group, seconds)
    # selecting a group or a half keeps each stream's half: the split is the whole set's
    report = build_set(("telephony",), data=shared_data, half="report")
    assert report and all(s.half == "report" == by_name[s.name].half for s in report)


def test_an_unknown_half_is_refused(shared_data: Path) -> None:
    with pytest.raises(ConfigError, match="unknown half"):
        build_set(data=shared_data, half="middle")
