"""Telephony audio on the native protocol: 8 kHz G.711 and PCM stereo, agent on one channel, customer on the other,
with real narrowband speech and tiny.en."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed

from streamer.app import App
from streamer.core.audio import encode_alaw, encode_mulaw
from streamer.server.serve import ServerConfig

SECONDS = 10.0
REFERENCES = (
    # the first three Harvard sentences of each recording fill its first ten seconds
    "The birch canoe slid on the smooth planks. Glue the sheet to the dark blue background. "
    "It's easy to tell the depth of a well.",
    "The boy was there when the sun rose. A rod is used to catch pink salmon. "
    "The source of the huge river is the clear spring.",
)


def load(shared: Path, name: str) -> npt.NDArray[np.float32]:
    import soundfile as sf

    audio, rate = sf.read(shared / "telephony" / name, dtype="float32")
    assert rate == 8000
    return np.asarray(audio[: int(SECONDS * rate)], dtype=np.float32)


def encode(interleaved: npt.NDArray[np.float32], encoding: str) -> bytes:
    if encoding == "mulaw":
        return encode_mulaw(interleaved)
    if encoding == "alaw":
        return encode_alaw(interleaved)
    return (np.clip(interleaved, -1, 1) * 32767).astype("<i2").tobytes()


@pytest.mark.model
@pytest.mark.parametrize("encoding", ["mulaw", "alaw", "pcm_s16le"])
async def test_stereo_call_gives_a_transcript_per_channel(shared_data: Path, tiny_engine: Any, encoding: str) -> None:
    from streamer.offline.normalize import normalize_english, word_error_rate

    left = load(shared_data, "OSR_us_000_0010_8k.wav")
    right = load(shared_data, "OSR_us_000_0011_8k.wav")
    data = encode(np.stack([left, right], axis=1).reshape(-1), encoding)
    frame = 2 * 160 * (2 if encoding == "pcm_s16le" else 1)  # 20 ms of stereo, as telephony gateways send it
    messages: list[dict[str, Any]] = []
    async with App(ServerConfig(port=0), tiny_engine) as srv:
        url = f"ws://127.0.0.1:{srv.port}/v1/listen?encoding={encoding}&sample_rate=8000&channels=2"
        async with ws_connect(url, max_queue=None) as ws:
            for i in range(0, len(data), frame):
                await ws.send(data[i : i + frame])
            await ws.send('{"type":"end"}')
            try:
                while True:
                    messages.append(json.loads(await ws.recv()))
            except ConnectionClosed:
                pass
    assert ws.close_code == 1000 and messages[-1]["type"] == "done"
    assert messages[-1]["audio_seconds_received"] == pytest.approx(2 * SECONDS, abs=0.01)
    for channel, reference in enumerate(REFERENCES):
        text = " ".join(m["text"] for m in messages if m["type"] == "final" and m["channel"] == channel)
        wer = word_error_rate([normalize_english(reference)], [normalize_english(text)]).wer
        assert wer < 0.35, (encoding, channel, text)
