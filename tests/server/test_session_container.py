"""Containerised audio on ``/v1/listen`` (``encoding=opus`` or ``container``): WebM/Opus as MediaRecorder sends it,
Ogg/Opus and WAV, in 1 KB frames. The adapter alone on the scripted engine for the mechanics and the accounting; the
real server and tiny.en on real speech for accuracy, against the same audio sent as PCM."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed

from streamer.app import App
from streamer.core.matroska import SIMPLE_BLOCK
from streamer.engine.fake import ScriptedEngine
from streamer.server.adapter import Close
from streamer.server.auth import Principal
from streamer.server.serve import ServerConfig
from streamer.server.session import Session
from tests.containers import encode, webm_elements
from tests.core.test_container import block, webm
from tests.helpers import WORDS, chunks, config, pcm16, pump, speech, until
from tests.server.test_resume import read_until
from tests.server.test_session import Listen, messages

KIB = 1024
OPUS_PADDING = 960 / 48000  # the encoder pads the last packet; a stream has no end to trim it to


def accounted(session: Session) -> None:
    """Every sample the session accepted ended in a final, a non-speech span or a named loss."""
    for channel in session.channels:
        assert channel.gaps() == [], channel.gaps()
        assert channel.transcribed + channel.non_speech + channel.lost == channel.core.samples_received


def finish(listen: Listen, session: Session, now: float) -> list[dict[str, Any]]:
    session.receive_text('{"type":"end"}', now)
    pump(listen.scheduler, listen.engine)
    return messages(session, now)


@pytest.mark.parametrize(("container", "codec"), [("webm", "libopus"), ("ogg", "libopus"), ("wav", "pcm_s16le")])
def test_a_container_in_1_kib_frames_is_transcribed_and_every_sample_accounted(container: str, codec: str) -> None:
    audio = speech()
    listen = Listen()
    session = listen.open(f"/v1/listen?encoding={'opus' if codec == 'libopus' else 'container'}")
    [ready] = messages(session)
    assert ready["sample_rate"] == 0 and ready["encoding"] in ("opus", "container")  # the rate is the container's
    now = listen.stream(session, chunks(encode(audio, 16000, container, codec), KIB))
    out = finish(listen, session, now)
    assert session.close_action() == Close(1000, "done")
    assert [m["type"] for m in out if m["type"] == "final"]
    done = out[-1]
    assert done["type"] == "done" and done["lost_seconds"] == 0
    seconds = len(audio) / 16000
    padding = OPUS_PADDING if codec == "libopus" else 0.0
    assert seconds - 1e-3 <= done["audio_seconds_received"] <= seconds + padding + 1e-3
    assert done["audio_seconds_transcribed"] + done["non_speech_seconds"] == pytest.approx(
        done["audio_seconds_received"], abs=1e-4
    )
    accounted(session)


def test_a_stereo_container_gives_a_transcript_per_channel_and_a_mono_one_cannot() -> None:
    left, right = speech(), speech()[::-1].copy()
    wav = encode(np.stack([left, right]), 8000, "wav", "pcm_mulaw")  # a stereo call recording, G.711 in WAV
    listen = Listen()
    session = listen.open("/v1/listen?encoding=container&channels=2")
    now = listen.stream(session, chunks(wav, KIB))
    out = finish(listen, session, now)
    assert {m["channel"] for m in out if m["type"] == "final"} == {0, 1}
    assert out[-1]["audio_seconds_received"] == pytest.approx(2 * len(left) / 8000, abs=1e-3)
    mono = listen.open("/v1/listen?encoding=opus&channels=2")
    listen.stream(mono, chunks(encode(left, 16000, "webm"), KIB))
    last = messages(mono)[-1]
    assert last["code"] == "unsupported_audio" and "holds 1 channel" in last["message"]
    assert mono.close_action() == Close(4415, "unsupported_audio")


def test_two_channels_mixed_down_for_one_transcript() -> None:
    listen = Listen()
    session = listen.open("/v1/listen?encoding=opus")
    audio = speech()
    now = listen.stream(session, chunks(encode(np.stack([audio, audio]), 16000, "webm"), KIB))
    out = finish(listen, session, now)
    assert len(session.channels) == 1 and out[-1]["audio_seconds_received"] == pytest.approx(
        len(audio) / 16000, abs=OPUS_PADDING + 1e-3
    )


def test_a_stream_cut_short_is_transcribed_up_to_the_cut_then_bad_container() -> None:
    audio = speech()
    data = encode(audio, 16000, "webm")
    blocks = [at for element, at, _ in webm_elements(data) if element == SIMPLE_BLOCK]
    cut = blocks[len(blocks) * 3 // 4] + 5  # inside a block
    listen = Listen()
    session = listen.open("/v1/listen?encoding=opus")
    messages(session)
    now = listen.stream(session, chunks(data[:cut], KIB))
    out = finish(listen, session, now)
    finals = [m for m in out if m["type"] == "final"]
    assert finals and out[-1]["type"] == "error" and out[-1]["code"] == "bad_container"
    assert "cut short" in out[-1]["message"] and session.close_action() == Close(4400, "bad_container")
    # the audio before the cut: every block before it, each 20 ms, less the decoder's pre-skip; all accounted
    received = session.channels[0].core.samples_received
    assert received == pytest.approx((len(blocks) * 3 // 4 * 960 - 312) / 3, abs=2)
    assert finals[-1]["end"] > 0.6 * len(audio) / 16000
    accounted(session)


def test_a_corrupt_page_ends_the_stream_with_bad_container_after_the_audio_before_it() -> None:
    audio = speech()
    data = bytearray(encode(audio, 16000, "ogg"))
    corrupt_at = data.index(b"OggS", len(data) // 2) + 40
    data[corrupt_at] ^= 0x01
    listen = Listen()
    session = listen.open("/v1/listen?encoding=opus")
    messages(session)
    listen.stream(session, chunks(bytes(data), KIB))  # the frames after the fault are not read
    assert session.close_action() == Close(4400, "bad_container")
    out = messages(session)
    assert [m["type"] for m in out].count("final") >= 1
    assert out[-1]["code"] == "bad_container" and "checksum" in out[-1]["message"]
    assert session.channels[0].core.samples_received >= 0.45 * len(audio)
    accounted(session)


@pytest.mark.parametrize(
    ("path", "data", "code", "close"),
    [
        ("/v1/listen?encoding=opus", b"RIFF\0\0\0\0WAVEfmt ", "unsupported_audio", 4415),  # WAV is not Opus
        ("/v1/listen?encoding=container", b"\0\0\0\0 raw PCM by mistake", "bad_container", 4400),
    ],
)
def test_audio_that_is_not_what_was_declared_is_refused_with_its_code(
    path: str, data: bytes, code: str, close: int
) -> None:
    listen = Listen()
    session = listen.open(path)
    messages(session)
    wav = encode(speech()[:8000], 16000, "wav", "pcm_s16le") if path.endswith("opus") else data
    session.receive_bytes(wav, 0.0)
    pump(listen.scheduler, listen.engine)
    out = messages(session)
    assert out[-1]["code"] == code and session.close_action() == Close(close, code)


def test_a_frame_that_decodes_past_the_burst_is_frame_too_large_and_rate_limits_are_charged_as_decoded() -> None:
    # 2 bytes of Opus for 120 ms (see tests/core/test_container.py): 1000 blocks, 8 KB, are 2 minutes of audio
    listen = Listen()
    session = listen.open("/v1/listen?encoding=opus")
    messages(session)
    session.receive_bytes(webm(), 0.0)
    session.receive_bytes(block(bytes([0xE3, 0x30])) * 1000, 0.0)
    pump(listen.scheduler, listen.engine)
    out = messages(session)
    assert out[-1]["code"] == "frame_too_large" and "at most 60 s of audio" in out[-1]["message"]
    # within the burst, frame by frame: 40 s each, the second exceeds the 60 s the bucket holds
    limited = listen.open("/v1/listen?encoding=opus")
    messages(limited)
    limited.receive_bytes(webm(), 0.0)
    limited.receive_bytes(block(bytes([0xE3, 0x30])) * 334, 0.0)
    limited.receive_bytes(block(bytes([0xE3, 0x30])) * 334, 0.1)
    pump(listen.scheduler, listen.engine)
    out = messages(limited)
    assert out[-1]["code"] == "rate_limited" and limited.close_action() == Close(4429, "rate_limited")
    assert limited.channels[0].core.samples_received == pytest.approx(40.08 * 16000, abs=320)  # the first only
    accounted(limited)


def test_a_resumed_container_session_takes_a_new_file_on_the_new_connection() -> None:
    owner = Principal("key-a")
    listen = Listen(resume_grace_seconds=30.0)
    session = listen.open("/v1/listen?encoding=opus", owner=owner)
    messages(session)
    audio = speech()
    data = encode(audio, 16000, "webm")
    now = listen.stream(session, chunks(data[: len(data) // 2], KIB))
    session.receive_connection_lost(now, dropped=True)
    before = session.channels[0].core.samples_received
    resumed = listen.open(f"/v1/listen?resume={session.id}&last_seq=0", now + 1.0, owner=owner)
    assert resumed is session
    ready = messages(session, now + 1.0)[0]
    assert ready["resumed"] and ready["audio_seconds_received"] == pytest.approx(before / 16000, abs=0.01)
    now = listen.stream(session, chunks(data, KIB), start=now + 1.0)  # a recorder restarted: a whole new file
    out = finish(listen, session, now)
    assert out[-1]["type"] == "done"
    assert out[-1]["audio_seconds_received"] == pytest.approx(before / 16000 + len(audio) / 16000, abs=0.05)
    accounted(session)


@pytest.mark.parametrize("shared", ["redis"], indirect=True)
async def test_a_container_session_taken_over_by_another_replica_goes_on_with_a_new_file(shared: str | None) -> None:
    audio = speech()
    data = encode(audio, 16000, "webm")
    options = config(shared, resume_grace_seconds=30.0)
    async with App(options, ScriptedEngine(WORDS)) as one, App(options, ScriptedEngine(WORDS)) as other:
        # 1. On one replica: the first half of a MediaRecorder file, until a final; then the connection drops.
        first = await ws_connect(f"ws://127.0.0.1:{one.port}/v1/listen?encoding=opus", max_queue=None)
        ready = json.loads(await first.recv())
        for frame in chunks(data[: len(data) // 2], KIB):
            await first.send(frame)
        await read_until(first, lambda m: m["type"] == "final")
        await until(lambda: one.redis is not None and one.redis.settled)  # the record is in Redis
        first.transport.abort()
        await until(lambda: ready["session_id"] in one.resumable)
        # 2. The reconnect lands on the other replica, with a recorder started afresh: a whole new file.
        url = f"ws://127.0.0.1:{other.port}/v1/listen?resume={ready['session_id']}&last_seq=1"
        async with ws_connect(url, max_queue=None) as second:
            again = json.loads(await second.recv())
            assert again["type"] == "ready" and again["resumed"] and again["encoding"] == "opus"
            assert again["sample_rate"] == 0 and again["resume_from"] > 0
            for frame in chunks(data, KIB):
                await second.send(frame)
            await second.send('{"type":"end"}')
            messages = await read_until(second, lambda m: m["type"] == "done")
        assert second.close_code == 1000
    done = messages[-1]
    # what the first replica had accounted for, then the whole new file: every sample of it accounted
    assert done["audio_seconds_received"] == pytest.approx(
        again["resume_from"] + len(audio) / 16000, abs=OPUS_PADDING + 1e-3
    )
    accounted = done["audio_seconds_transcribed"] + done["non_speech_seconds"] + done["lost_seconds"]
    assert accounted == pytest.approx(done["audio_seconds_received"], abs=1e-3)


# -- the real server and tiny.en: the same WER as PCM --------------------------------------------------------------

UTTERANCES = ("1089-134686-0000.flac", "121-127105-0000.flac")


def references(shared: Path) -> dict[str, str]:
    rows = (line.split("\t") for line in (shared / "librispeech" / "transcripts.tsv").read_text().splitlines())
    return {Path(row[0]).name: row[1] for row in rows if len(row) == 2}


async def transcribe(port: int, query: str, data: bytes, frame: int) -> list[dict[str, Any]]:
    """Send ``data`` in ``frame``-byte frames, paced a little as a live client would, then end; every message."""
    out: list[dict[str, Any]] = []
    async with ws_connect(f"ws://127.0.0.1:{port}/v1/listen?{query}", max_queue=None) as ws:

        async def receive() -> None:
            try:
                while True:
                    out.append(json.loads(await ws.recv()))
            except ConnectionClosed:
                pass

        reader = asyncio.create_task(receive())
        for start in range(0, len(data), frame):
            await ws.send(data[start : start + frame])
            await asyncio.sleep(0.005)
        await ws.send('{"type":"end"}')
        await reader
    return out


@pytest.mark.model
async def test_webm_and_ogg_opus_are_transcribed_as_accurately_as_pcm(shared_data: Path, tiny_engine: Any) -> None:
    import soundfile as sf

    from streamer.offline.normalize import normalize_english, word_error_rate

    refs = references(shared_data)
    clips = [sf.read(next((shared_data / "librispeech").rglob(name)), dtype="float32")[0] for name in UTTERANCES]
    pause = np.zeros(16000, dtype=np.float32)
    audio: npt.NDArray[np.float32] = np.concatenate([part for clip in clips for part in (clip, pause)])
    reference = normalize_english(" ".join(refs[name] for name in UTTERANCES))
    streams = {
        "pcm": ("encoding=pcm_s16le&sample_rate=16000", pcm16(audio), 3200),
        "webm": ("encoding=opus", encode(audio, 16000, "webm"), KIB),
        "ogg": ("encoding=opus", encode(audio, 16000, "ogg"), KIB),
    }
    wer = {}
    async with App(ServerConfig(port=0), tiny_engine) as srv:
        for name, (query, data, frame) in streams.items():
            out = await transcribe(srv.port, query, data, frame)
            assert out[-1]["type"] == "done", out[-1]
            text = " ".join(m["text"] for m in out if m["type"] == "final")
            wer[name] = word_error_rate([reference], [normalize_english(text)]).wer
    assert wer["pcm"] <= 0.15, wer
    assert wer["webm"] <= wer["pcm"] + 0.03 and wer["ogg"] <= wer["pcm"] + 0.03, wer
