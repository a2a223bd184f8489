"""The server with the real tiny.en model on loopback: what a user of `streamer serve` sees.

(tests/server/test_serve.py covers the protocol mechanics on the fake engine;
these cover accuracy and the real command.)
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed

from streamer.app import App
from streamer.engine.whisper import WhisperEngine
from streamer.offline.normalize import normalize_english, word_error_rate
from streamer.server.serve import ServerConfig
from tests.conftest import CLIPS, load_clip
from tests.helpers import http_get, pcm16

pytestmark = pytest.mark.model

CLIP = "1089-134686-0000.flac"


async def stream(port: int, audio: np.ndarray, pace: float = 0.0, end: bool = True) -> tuple[list[dict[str, Any]], int]:
    """Stream 100 ms frames (``pace`` seconds apart), send end, collect every message until the close."""
    messages: list[dict[str, Any]] = []
    async with ws_connect(f"ws://127.0.0.1:{port}/v1/listen?sample_rate=16000", max_queue=None) as ws:

        async def receive() -> None:
            try:
                while True:
                    messages.append(json.loads(await ws.recv()))
            except ConnectionClosed:
                pass

        reader = asyncio.create_task(receive())
        data = pcm16(audio)
        for i in range(0, len(data), 3200):
            await ws.send(data[i : i + 3200])
            if pace:
                await asyncio.sleep(pace)
        if end:
            await ws.send('{"type":"end"}')
        await reader
        assert ws.close_code is not None
        return messages, ws.close_code


def finals_text(messages: list[dict[str, Any]]) -> str:
    return " ".join(m["text"] for m in messages if m["type"] == "final")


async def test_streamed_transcript_of_real_speech_is_accurate(tiny_engine: WhisperEngine) -> None:
    audio = np.concatenate([load_clip(CLIP), np.zeros(8000, np.float32)])
    async with App(ServerConfig(port=0), tiny_engine) as server:
        messages, code = await stream(server.port, audio, pace=0.02)
    assert code == 1000
    assert messages[0]["type"] == "ready" and messages[-1]["type"] == "done"
    wer = word_error_rate([normalize_english(CLIPS[CLIP])], [normalize_english(finals_text(messages))]).wer
    assert wer <= 0.15, finals_text(messages)
    assert any(m["type"] == "partial" for m in messages)
    done = messages[-1]
    # every sample accounted: transcribed speech plus non-speech equals what was sent
    sent = len(audio) / 16000
    assert abs(done["audio_seconds_received"] - sent) < 1e-3
    assert abs(done["audio_seconds_transcribed"] + done["non_speech_seconds"] + done["lost_seconds"] - sent) < 1e-3
    words = [w for m in messages if m["type"] == "final" for w in m["words"]]
    assert [w["start"] for w in words] == sorted(w["start"] for w in words)
    assert all(0 <= w["start"] <= w["end"] <= sent for w in words)


async def test_two_concurrent_streams_each_get_their_own_transcript(tiny_engine: WhisperEngine) -> None:
    a = np.concatenate([load_clip(CLIP), np.zeros(8000, np.float32)])
    b = np.concatenate([load_clip("121-127105-0000.flac"), np.zeros(8000, np.float32)])
    async with App(ServerConfig(port=0), tiny_engine) as server:
        (ma, _), (mb, _) = await asyncio.gather(stream(server.port, a), stream(server.port, b))
    for messages, name in ((ma, CLIP), (mb, "121-127105-0000.flac")):
        wer = word_error_rate([normalize_english(CLIPS[name])], [normalize_english(finals_text(messages))]).wer
        assert wer <= 0.2, (name, finals_text(messages))


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        return int(error.code)
    except OSError:
        return 0


def test_streamer_serve_loads_the_default_model_and_drains_on_sigterm(tmp_path: Path) -> None:
    """The README's main command: readyz turns 200 once the model is warm; SIGTERM flushes finals, closes 1001."""
    port = _free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    log = (tmp_path / "serve.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamer", "serve", "--port", str(port)], stdout=log, stderr=subprocess.STDOUT, env=env
    )
    try:
        deadline = time.monotonic() + 120
        while _get(f"http://127.0.0.1:{port}/readyz") != 200:
            assert proc.poll() is None, (tmp_path / "serve.log").read_text()
            assert time.monotonic() < deadline, "the model did not load within 2 minutes"
            time.sleep(0.5)

        async def scenario() -> tuple[list[dict[str, Any]], int]:
            audio = load_clip(CLIP)
            task = asyncio.create_task(stream(port, audio, pace=0.01, end=False))
            # mid-stream: the server has all the speech (GET /status says so), and no end was sent
            sent = pytest.approx(len(audio) / 16000, abs=1e-3)
            async with asyncio.timeout(120):  # a hang guard
                while not any(
                    s["audio_seconds"] == sent for s in json.loads((await http_get(port, "/status"))[2])["sessions"]
                ):
                    await asyncio.sleep(0.05)
            proc.send_signal(signal.SIGTERM)
            return await task

        messages, code = asyncio.run(scenario())
        assert code == 1001
        assert any(m["type"] == "final" and m["text"] for m in messages)
        errors = [m for m in messages if m["type"] == "error"]
        assert errors and errors[-1]["code"] == "shutting_down"
        # finals go out before the error that precedes the close
        assert max(i for i, m in enumerate(messages) if m["type"] == "final") < messages.index(errors[-1])
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()
