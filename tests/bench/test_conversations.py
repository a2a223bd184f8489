"""Synthetic conversations (issue 40): 2 to 4 LibriSpeech readers of one half, turns of whole utterances by a
different speaker each time, the gaps and overlaps asked for, ground truth that matches the audio, and the same
conversation from the same seed."""

from __future__ import annotations

import itertools
import random
from pathlib import Path

import numpy as np
import pytest

from streamer.bench.conversations import (
    ConversationOptions,
    SourceUtterance,
    build_conversations,
    plan_conversation,
    read_textgrid,
    read_utterances,
    real_conversations,
    speaker_halves,
    spread_words,
    voiced_extent,
)
from streamer.core.errors import ConfigError


def pool(speakers: int, each: int) -> list[SourceUtterance]:
    return [
        SourceUtterance(f"{s}-1-{i:04d}", str(s), f"x/{s}-{i}.flac", 2.0 + i, "A B C")
        for s in range(1, speakers + 1)
        for i in range(each)
    ]


def test_a_plan_takes_turns_of_unused_utterances_with_the_asked_gaps() -> None:
    options = ConversationOptions(overlap_probability=0.3)
    for seed in range(20):
        plan = plan_conversation(pool(6, 8), random.Random(seed), options)
        speakers = [t.utterance.speaker for t in plan]
        assert 2 <= len(set(speakers)) <= 4
        assert all(a != b for a, b in itertools.pairwise(speakers))
        assert len({t.utterance.utt_id for t in plan}) == len(plan)
        assert plan[0].offset_s == 0.0
        for turn in plan[1:]:
            assert 0.15 <= turn.offset_s <= 0.9 or -0.8 <= turn.offset_s <= -0.2
    # the same seed, the same plan
    assert plan_conversation(pool(6, 8), random.Random(7)) == plan_conversation(pool(6, 8), random.Random(7))


def test_a_plan_stops_when_no_other_speaker_has_an_utterance_left() -> None:
    plan = plan_conversation(pool(2, 1), random.Random(0), ConversationOptions(max_speakers=2))
    assert len(plan) == 2


def test_too_few_speakers_or_bad_options_are_refused() -> None:
    with pytest.raises(ConfigError):
        plan_conversation(pool(1, 5), random.Random(0))
    with pytest.raises(ConfigError):
        ConversationOptions(min_speakers=3, max_speakers=2).validate()


def test_words_are_spread_by_their_letters() -> None:
    words = spread_words("AB CDEF", 0, 700, "1")
    # letters 2 + space 1 + letters 4 = 7 shares of 100 samples
    assert [(w.start, w.end, w.text) for w in words] == [(0, 200, "AB"), (300, 700, "CDEF")]


def test_the_voiced_extent_skips_leading_and_trailing_silence() -> None:
    samples = np.zeros(16000, dtype=np.float32)
    samples[4000:12000] = 0.1 * np.sin(np.arange(8000) * 0.3)
    assert voiced_extent(samples) == (4000, 12000)


def test_the_halves_split_the_readers(shared_data: Path) -> None:
    halves = speaker_halves(read_utterances(shared_data))
    tune = {s for s, h in halves.items() if h == "tune"}
    report = {s for s, h in halves.items() if h == "report"}
    assert tune and report and not tune & report and len(tune | report) == len(halves)


def test_conversations_are_built_from_their_half_with_matching_ground_truth(shared_data: Path) -> None:
    halves = speaker_halves(read_utterances(shared_data))
    (conversation,) = build_conversations("report", 1, seed=3, data=shared_data)
    assert {halves[s] for s in conversation.speakers} == {"report"}
    assert 2 <= len(conversation.speakers) <= 4
    for turn in conversation.turns:
        # the voice is where the ground truth says, and the words are inside the turn
        inside = float(np.sqrt(np.mean(np.square(conversation.samples[turn.start : turn.end]))))
        assert inside > 0.01
        assert turn.words[0].start >= turn.start and turn.words[-1].end <= turn.end
    lines = conversation.rttm().splitlines()
    assert len(lines) == len(conversation.turns) and lines[0].startswith(f"SPEAKER {conversation.name} 1 ")
    again = build_conversations("report", 1, seed=3, data=shared_data)[0]
    assert again.turns == conversation.turns


TEXTGRID = """File type = "ooTextFile"
Object class = "TextGrid"
xmin = 0
xmax = 4
tiers? <exists>
size = 2
item []:
    item [1]:
        class = "IntervalTier"
        name = "ann"
        xmin = 0
        xmax = 4
        intervals: size = 2
        intervals [1]:
            xmin = 0
            xmax = 0.5
            text = ""
        intervals [2]:
            xmin = 0.5
            xmax = 1.5
            text = "hello there
you"
    item [2]:
        class = "IntervalTier"
        name = "bob"
        xmin = 0
        xmax = 4
        intervals: size = 2
        intervals [1]:
            xmin = 0
            xmax = 2
            text = ""
        intervals [2]:
            xmin = 2
            xmax = 3.25
            text = "hi"
"""


def test_a_textgrid_s_intervals_with_text_are_its_tiers_turns() -> None:
    ann, bob = read_textgrid(TEXTGRID)
    assert (ann.speaker, ann.start, ann.end) == ("ann", 8000, 24000)
    assert [w.text for w in ann.words] == ["hello", "there", "you"]  # a line break inside the text is a space
    assert ann.words[0].start == 8000 and ann.words[-1].end == 24000
    assert (bob.speaker, bob.start, bob.end, [w.text for w in bob.words]) == ("bob", 32000, 52000, ["hi"])


def test_the_shared_real_conversation_is_mono_with_its_two_talkers_turns(shared_data: Path) -> None:
    (conversation,) = real_conversations(shared_data)
    assert conversation.samples.ndim == 1 and conversation.half == "report"
    assert conversation.speakers == ("michael", "sickmichael")
    assert len(conversation.turns) == 7 and conversation.turns == tuple(
        sorted(conversation.turns, key=lambda t: t.start)
    )
    assert abs(conversation.seconds - 52.44) < 0.01
    for turn in conversation.turns:  # a talker's voice is in the mix where the TextGrid puts their turn
        assert float(np.sqrt(np.mean(np.square(conversation.samples[turn.start : turn.end])))) > 0.005
