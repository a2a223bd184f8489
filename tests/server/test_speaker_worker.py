from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from streamer.core.diarization import EmbedRequest
from streamer.core.errors import DiarizationUnavailable, UnsupportedAudio
from streamer.core.options import CoreOptions
from streamer.engine.fake import ScriptedEngine
from streamer.server.adapter import Close
from streamer.server.auth import ANONYMOUS
from streamer.server.metrics import ServerMetrics
from streamer.server.resume import ResumeRegistry
from streamer.server.scheduler import Scheduler, SchedulerOptions
from streamer.server.session import Session
from streamer.server.session_options import SessionOptions
from streamer.server.speaker_worker import SpeakerWorker
from streamer.server.takeover import open_listen_session
from tests.conftest import load_clip
from tests.helpers import WORDS, ManualTimers, chunks, pcm16, pump, until

RATE = 16000
A = load_clip("1089-134686-0000.flac")
B = load_clip("121-127105-0000.flac")
PAUSE = np.zeros(RATE, dtype=np.float32)
# two readers, one after the other
AUDIO = np.concatenate([A, PAUSE, B, PAUSE])
B_STARTS = len(A) + len(PAUSE)


def by_reader(requests: list[EmbedRequest]) -> npt.NDArray[np.float32]:
    """A stand-in voice encoder that knows who reads where (the real one is held to its accuracy by
    tests/bench/test_speakers.py)."""
    return np.array([[1.0, 0.0] if (r.start + r.end) // 2 < B_STARTS else [0.0, 1.0] for r in requests], np.float32)


class Diarizing:
    """``/v1/listen`` sessions over a scheduler and a speaker worker the test runs by hand."""

    def __init__(self, available: bool = True) -> None:
        self.engine = ScriptedEngine(WORDS)
        self.metrics = ServerMetrics()
        self.scheduler = Scheduler(self.engine, SchedulerOptions(), self.metrics)
        self.speakers = SpeakerWorker(self.metrics, load=lambda: pytest.fail("the test embeds"), available=available)
        self.registry = ResumeRegistry(ManualTimers().call_later)
        self.failing = False

    def open(self, path: str) -> Session:
        return open_listen_session(
            path,
            ANONYMOUS,
            self.scheduler,
            CoreOptions(),
            SessionOptions(),
            "tiny.en",
            self.metrics,
            self.registry,
            0.0,
            speakers=self.speakers,
        )

    def pump(self) -> None:
        """Embed and decode until neither has anything left."""
        while True:
            batch = self.speakers.next_batch()
            if batch:
                requests = [r for _, rs in batch for r in rs]
                if self.failing:
                    self.speakers.fail(batch, "the voice encoder failed (RuntimeError)")
                else:
                    self.speakers.deliver(batch, by_reader(requests))
            if not pump(self.scheduler, self.engine) and not batch:
                return

    def run(self, session: Session, audio: npt.NDArray[np.float32] = AUDIO, end: bool = True) -> list[dict[str, Any]]:
        now = 0.0
        for frame in chunks(pcm16(audio)):
            session.receive_bytes(frame, now)
            self.pump()
            now += 0.1
        if end:
            session.receive_text('{"type":"end"}', now)
            self.pump()
        return [json.loads(m) for m in session.messages_to_send(now)]


def test_a_diarized_session_labels_every_final_and_word_and_done_lists_the_talk_times() -> None:
    diarizing = Diarizing()
    session = diarizing.open("/v1/listen?diarize=true")
    out = diarizing.run(session)
    assert session.close_action() == Close(1000, "done")
    finals = [m for m in out if m["type"] == "final"]
    assert finals
    for final in finals:
        assert final["speaker"] in (0, 1)
        for word in final["words"]:
            # the scripted engine writes words through the pause too: those near the change may go either way
            if word["end"] * RATE <= B_STARTS - RATE // 2:
                assert word["speaker"] == 0, (word, final)
            elif word["start"] * RATE >= B_STARTS + RATE // 2:
                assert word["speaker"] == 1, (word, final)
        assert final["speaker"] == max(
            {0, 1}, key=lambda s: sum(w["end"] - w["start"] for w in final["words"] if w["speaker"] == s)
        )
    assert {f["speaker"] for f in finals} == {0, 1}
    done = out[-1]
    assert done["type"] == "done" and done["lost_seconds"] == 0
    talk = {(t["channel"], t["speaker"]): t["talk_seconds"] for t in done["speakers"]}
    for speaker in (0, 1):
        spoken = sum(w["end"] - w["start"] for f in finals for w in f["words"] if w["speaker"] == speaker)
        assert talk[(0, speaker)] == pytest.approx(spoken, abs=0.01)
    assert diarizing.metrics.speaker_windows._value.get() == 0  # the test embedded by hand, not the worker's loop


def test_without_diarize_nothing_on_the_wire_changes() -> None:
    diarizing = Diarizing()
    out = diarizing.run(diarizing.open("/v1/listen"))
    assert all("speaker" not in m and "speakers" not in m for m in out)
    assert all("speaker" not in w for m in out if m["type"] == "final" for w in m["words"])
    assert diarizing.speakers.next_batch() == []


def test_a_stereo_session_is_diarized_per_channel() -> None:
    diarizing = Diarizing()
    session = diarizing.open("/v1/listen?diarize=true&channels=2")
    stereo = np.stack([AUDIO, AUDIO], axis=1).reshape(-1)
    out = diarizing.run(session, stereo)
    done = out[-1]
    assert {(t["channel"], t["speaker"]) for t in done["speakers"]} == {(0, 0), (0, 1), (1, 0), (1, 1)}


@pytest.mark.parametrize(
    ("path", "refusal", "complaint"),
    [
        ("/v1/listen?diarize=yes", UnsupportedAudio, "diarize must be true or false"),
        ("/v1/listen?diarize=true&max_speakers=0", UnsupportedAudio, "max_speakers must be between 1 and 32"),
        ("/v1/listen?diarize=true&max_speakers=33", UnsupportedAudio, "max_speakers must be between 1 and 32"),
        ("/v1/listen?max_speakers=2", UnsupportedAudio, "max_speakers needs diarize=true"),
    ],
)
def test_bad_speaker_parameters_are_refused_before_any_audio(
    path: str, refusal: type[Exception], complaint: str
) -> None:
    diarizing = Diarizing()
    with pytest.raises(refusal, match=complaint):
        diarizing.open(path)
    assert diarizing.scheduler.next_batch() is None


def test_diarize_on_a_server_without_the_speaker_model_is_refused_with_4415() -> None:
    diarizing = Diarizing(available=False)
    with pytest.raises(DiarizationUnavailable) as refused:
        diarizing.open("/v1/listen?diarize=true")
    assert refused.value.code == "diarization_unavailable" and refused.value.close_code == 4415
    session = diarizing.open("/v1/listen")  # the transcript alone is served
    session.receive_text('{"type": "configure", "diarize": true}', 0.0)
    out = [json.loads(m) for m in session.messages_to_send(0.0)]
    assert out[-1]["code"] == "diarization_unavailable"
    assert session.close_action() == Close(4415, "diarization_unavailable")


def test_a_failing_encoder_says_so_once_and_the_transcript_goes_on_unlabelled() -> None:
    diarizing = Diarizing()
    diarizing.failing = True
    session = diarizing.open("/v1/listen?diarize=true")
    out = diarizing.run(session)
    errors = [m for m in out if m["type"] == "error"]
    assert len(errors) == 1 and errors[0]["code"] == "diarization_failed" and "RuntimeError" in errors[0]["message"]
    finals = [m for m in out if m["type"] == "final"]
    assert finals and all("speaker" not in f for f in finals)
    assert out[-1]["type"] == "done" and out[-1]["lost_seconds"] == 0
    assert session.close_action() == Close(1000, "done")


def test_configure_turns_speaker_labels_on_mid_session_with_a_bound() -> None:
    diarizing = Diarizing()
    session = diarizing.open("/v1/listen")
    first = diarizing.run(session, AUDIO[: len(A)], end=False)
    session.receive_text('{"type": "configure", "diarize": true, "max_speakers": 1}', 1.0)
    out = diarizing.run(session, AUDIO[len(A) :])
    assert all("speaker" not in m for m in first)
    finals = [m for m in out if m["type"] == "final" and m["start"] * RATE >= len(A)]
    assert finals and {f["speaker"] for f in finals} == {0}  # max_speakers 1: B is speaker 0 too
    assert out[-1]["speakers"] and {t["speaker"] for t in out[-1]["speakers"]} == {0}


@pytest.mark.parametrize(
    ("frame", "complaint"),
    [
        ('{"type": "configure", "diarize": "yes"}', "diarize must be true or false"),
        ('{"type": "configure", "diarize": true, "max_speakers": 40}', "max_speakers must be between 1 and 32"),
    ],
)
def test_a_bad_speaker_configure_is_a_bad_message(frame: str, complaint: str) -> None:
    diarizing = Diarizing()
    session = diarizing.open("/v1/listen")
    session.receive_text(frame, 0.0)
    out = [json.loads(m) for m in session.messages_to_send(0.0)]
    assert out[-1]["code"] == "bad_message" and complaint in out[-1]["message"]


async def test_the_worker_embeds_on_its_thread_in_batches_and_hands_each_stream_its_own() -> None:
    class Constant:
        def embed_windows(self, windows: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
            return np.tile(np.array([[0.0, 1.0]], np.float32), (len(windows), 1))

    metrics = ServerMetrics()
    engine = ScriptedEngine(WORDS)
    scheduler = Scheduler(engine, SchedulerOptions(), metrics)
    worker = SpeakerWorker(metrics, load=Constant, available=True)
    worker.start()
    try:
        sessions = [
            open_listen_session(
                "/v1/listen?diarize=true",
                ANONYMOUS,
                scheduler,
                CoreOptions(),
                replace(SessionOptions()),
                "tiny.en",
                metrics,
                ResumeRegistry(ManualTimers().call_later),
                0.0,
                speakers=worker,
            )
            for _ in range(2)
        ]
        for frame in chunks(pcm16(AUDIO[: 8 * RATE])):
            for session in sessions:
                session.receive_bytes(frame, 0.0)
        await until(lambda: all(not c.diarizer.busy for s in sessions for c in s.channels if c.diarizer))
        assert metrics.speaker_windows._value.get() >= 2 * 6  # 8 s of speech: windows every 0.75 s, both streams
        for session in sessions:
            assert session.channels[0].diarizer is not None
            assert session.channels[0].diarizer.tracker.speakers == 1
    finally:
        await worker.stop()


def test_configure_turns_speaker_labels_off_and_done_keeps_the_talk_so_far() -> None:
    diarizing = Diarizing()
    session = diarizing.open("/v1/listen?diarize=true")
    first = diarizing.run(session, AUDIO[: len(A)], end=False)
    session.receive_text('{"type": "configure", "diarize": false}', 1.0)
    later = diarizing.run(session, AUDIO[len(A) :])
    labelled = [m for m in first + later if m["type"] == "final" and "speaker" in m]
    assert labelled and all(m["end"] * RATE <= len(A) + RATE for m in labelled)
    assert any(m["type"] == "final" and "speaker" not in m for m in later)  # B's, after the switch
    assert later[-1]["type"] == "done" and {t["speaker"] for t in later[-1]["speakers"]} == {0}
    assert diarizing.speakers.next_batch() == []


async def test_the_worker_loads_the_encoder_at_start_and_embeds_a_backlog_a_batch_at_a_time() -> None:
    """The encoder is loaded and run once before any stream asks (its memory and load time are the server's, not the
    first diarizing stream's); a stream that sends 30 s at once is embedded MAX_BATCH windows at a time, so the
    encoder's batch is bounded whatever one client sends."""
    from streamer.server.speaker_worker import MAX_BATCH

    batches: list[int] = []

    class Recording:
        def embed_windows(self, windows: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
            batches.append(len(windows))
            return np.tile(np.array([[0.0, 1.0]], np.float32), (len(windows), 1))

    metrics = ServerMetrics()
    scheduler = Scheduler(ScriptedEngine(WORDS), SchedulerOptions(), metrics)
    worker = SpeakerWorker(metrics, load=Recording, available=True)
    worker.start()
    try:
        await until(lambda: bool(batches))
        assert batches == [MAX_BATCH]  # the warm-up: a full batch, before any session
        session = open_listen_session(
            "/v1/listen?diarize=true",
            ANONYMOUS,
            scheduler,
            CoreOptions(),
            SessionOptions(),
            "tiny.en",
            metrics,
            ResumeRegistry(ManualTimers().call_later),
            0.0,
            speakers=worker,
        )
        audio = np.concatenate([AUDIO] * 4)[: 30 * RATE]  # one frame under the 1 MiB limit
        session.receive_bytes(pcm16(audio), 0.0)  # 30 s at once
        await until(lambda: all(not c.diarizer.busy for c in session.channels if c.diarizer))
        windows = batches[1:]
        assert sum(windows) == metrics.speaker_windows._value.get() > MAX_BATCH  # more than one batch's worth ...
        assert max(windows) <= MAX_BATCH  # ... embedded a batch at a time
    finally:
        await worker.stop()
