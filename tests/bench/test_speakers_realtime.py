"""Speaker labels at real time (issue 40's bench, streamer.bench.speakers_realtime): a run's words become speaker
turns and are scored (our DER agrees with pyannote.metrics'), and the Deepgram SDK's stream is read into the same
run as the protocol v1 client's."""

from __future__ import annotations

import argparse
import importlib.util
import random
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from streamer.bench.conversations import Conversation, Turn, build_conversations
from streamer.bench.harness import ReceivedTranscript, StreamRun, TimedWord
from streamer.bench.speakers import FRAME, SpeakerSegment, diarization_error, pyannote_error, segment_frames
from streamer.bench.speakers_realtime import score_realtime, speaker_segments
from streamer.server.server_messages import Done, LatencySummary, Percentiles, SpeakerTalk

SECOND = 16000


@pytest.fixture(scope="module")
def conversations(shared_data: Path) -> list[Conversation]:
    """Two conversations of the report half."""
    return build_conversations("report", 2, seed=1, data=shared_data)


def final(start: float, end: float, *words: TimedWord) -> ReceivedTranscript:
    return ReceivedTranscript(True, " ".join(w.text for w in words), start, end, 0.0, end, tuple(words))


def test_finals_make_turns_with_their_pauses_and_fillers() -> None:
    """A final's span is the speech it accounts for: its pauses and a filler it wrote no word for belong to the turn;
    a change of speaker inside a final cuts it halfway through the pause; a speaker's pieces under 0.5 s apart join,
    and an unlabelled final joins the turn it touches."""
    finals = [
        final(0.0, 1.0, TimedWord("a", 0.2, 0.5, 0)),  # the span, not the word: 0.0 to 1.0
        final(1.4, 2.0, TimedWord("b", 1.5, 1.8, 0)),  # 0.4 s after: the same turn
        final(2.6, 4.0, TimedWord("c", 2.7, 3.0, 0), TimedWord("d", 3.4, 3.8, 1)),  # 0.6 s after: a new turn, cut
        final(4.0, 4.5),  # a filler with no word: the turn it touches
        final(5.5, 6.0, TimedWord("e", 5.6, 5.9, None)),  # unlabelled and alone: no turn
    ]
    assert speaker_segments(finals) == [
        SpeakerSegment(0, 2 * SECOND, 0),
        SpeakerSegment(round(2.6 * SECOND), round(3.2 * SECOND), 0),
        SpeakerSegment(round(3.2 * SECOND), round(4.5 * SECOND), 1),
    ]


def test_a_real_time_run_is_scored_by_its_words_times_and_speakers(conversations: list[Conversation]) -> None:
    """score_realtime on a run made up from the reference itself: every word right, the count right, DER small
    (one final over the whole conversation, cut between its speakers' words), WER 0; a run naming every word
    speaker 0 gets one speaker's share; without a ``done`` (Deepgram) the count is the labels the words carry."""
    conversation = conversations[0]
    names = list(conversation.speakers)

    def run(speaker_of: Callable[[str], int], summary: bool = True) -> StreamRun:
        words = tuple(
            TimedWord(w.text, w.start / SECOND, w.end / SECOND, speaker_of(w.speaker)) for w in conversation.words
        )
        final = ReceivedTranscript(True, " ".join(w.text for w in words), 0.0, words[-1].end, 0.0, 1.0, words)
        found = sorted({speaker_of(n) for n in names})
        none = Percentiles(None, None)
        done = Done(1.0, 1.0, 0.0, 0.0, LatencySummary(none, none), tuple(SpeakerTalk(0, s, 1.0) for s in found))
        return StreamRun(conversation.name, 1.0, 1.0, (final,), done if summary else None, (), 1.0)

    right = score_realtime(conversation, run(names.index))
    assert right.words == len(conversation.words) and right.words_right == right.words
    assert right.found == right.speakers == len(names) and right.wer.wer == 0.0
    assert right.der.der < 0.15
    one = score_realtime(conversation, run(lambda _: 0))
    most = max(sum(w.speaker == n for w in conversation.words) for n in names)
    assert one.words_right == most and one.found == 1
    assert score_realtime(conversation, run(names.index, summary=False)).found == len(names)


def random_conversation(rng: random.Random) -> Conversation:
    """Turns of 2 to 4 speakers with gaps, now and then an overlap, over about a minute (no audio needed)."""
    turns, at = [], 0
    speakers = [f"s{i}" for i in range(rng.randint(2, 4))]
    while at < 55 * SECOND:
        start = at + rng.randint(-SECOND // 2, SECOND)
        end = max(start, 0) + rng.randint(SECOND, 8 * SECOND)
        turns.append(Turn(rng.choice(speakers), max(start, 0), end, f"u{len(turns)}", ()))
        at = end
    return Conversation("random", np.zeros(at + SECOND, dtype=np.float32), tuple(turns), "report")


def perturbed(conversation: Conversation, rng: random.Random) -> list[SpeakerSegment]:
    """A hypothesis near the truth, one voice at a time on the 10 ms grid: edges moved by up to 0.6 s, some turns
    dropped, some labels wrong, a false alarm or two."""
    names = list(conversation.speakers)
    drawn = []
    for turn in conversation.turns:
        if rng.random() < 0.1:
            continue
        label = names.index(turn.speaker) if rng.random() > 0.15 else rng.randrange(len(names) + 1)
        start = turn.start + rng.randint(-SECOND * 6 // 10, SECOND * 6 // 10)
        drawn.append((start, turn.end + rng.randint(-SECOND * 6 // 10, SECOND * 6 // 10), label))
    for _ in range(rng.randint(0, 2)):
        start = rng.randrange(len(conversation.samples) - 2 * SECOND)
        drawn.append((start, start + rng.randint(1600, 2 * SECOND), rng.randrange(len(names))))
    segments: list[SpeakerSegment] = []
    for start, end, label in sorted(drawn):
        start = max(start // FRAME * FRAME, segments[-1].end if segments else 0)
        end = min(end // FRAME * FRAME, len(conversation.samples) // FRAME * FRAME)
        if end > start:
            segments.append(SpeakerSegment(start, end, label))
    return segments


@pytest.mark.skipif(importlib.util.find_spec("pyannote") is None, reason="pyannote.metrics is not installed")
def test_our_der_agrees_with_pyannote_metrics() -> None:
    """Twenty random conversations (overlaps included) against hypotheses near and far from the truth: our
    frame-level DER, its collar and the overlap it skips, is pyannote.metrics' to within a tenth of a point."""
    rng = random.Random(40)
    for _ in range(20):
        conversation = random_conversation(rng)
        segments = perturbed(conversation, rng)
        ours = diarization_error(conversation, *segment_frames(segments))
        theirs = pyannote_error(conversation, segments)
        assert theirs is not None
        assert ours.scored == pytest.approx(theirs.scored, abs=len(conversation.turns) * 2)
        assert ours.der == pytest.approx(theirs.der, abs=0.001), (ours, theirs)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
async def test_the_deepgram_sdk_s_stream_reads_like_the_native_client_s() -> None:
    """The same audio through the Deepgram endpoint (the official SDK) and /v1/listen on one scripted server: the
    same final words at the same times; the Deepgram run has no ``done`` and logs every chunk it sent."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        pytest.importorskip("deepgram")
    from streamer.bench.harness import serve, stream_file
    from streamer.bench.speakers_realtime import stream_file_deepgram
    from streamer.core.options import CoreOptions
    from streamer.engine.fake import ScriptedEngine
    from tests.helpers import WORDS, speech

    audio = speech()
    args = argparse.Namespace(engine="scripted", model="scripted")
    async with serve(ScriptedEngine(WORDS), args, core=CoreOptions()) as server:
        deepgram = await stream_file_deepgram(server.port, "dg", audio, speed=0.0, chunk_ms=100)
        native = await stream_file(f"ws://127.0.0.1:{server.port}", "v1", audio, speed=0.0, chunk_ms=100)
    assert deepgram.done is None and not deepgram.errors
    assert len(deepgram.sent) == -(-len(audio) // 1600)
    assert deepgram.finals and deepgram.text.split() == native.text.split()
    ours = [(w.text, round(w.start, 2), round(w.end, 2)) for f in deepgram.finals for w in f.words]
    theirs = [(w.text, round(w.start, 2), round(w.end, 2)) for f in native.finals for w in f.words]
    assert ours == theirs
