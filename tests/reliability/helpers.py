"""Helpers the reliability tests share: long speech, and a client that streams it and keeps what came back."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed

from streamer.cli.terminal import paced_chunks
from streamer.engine.fake import words_from_text
from tests.helpers import pcm16, speech

__all__ = ["LONG_WORDS", "StreamOutcome", "looped_speech", "stream"]

# a word every 0.3 s for 20 minutes of stream time: long streams always have words to transcribe
LONG_WORDS = words_from_text(" ".join(f"w{i}" for i in range(4000)), 0, 4000, 800)


def looped_speech(seconds: float) -> npt.NDArray[np.float32]:
    """The test speech (two utterances and pauses) repeated to ``seconds``."""
    one = speech()
    reps = int(np.ceil(seconds * 16000 / len(one)))
    return np.tile(one, reps)[: int(seconds * 16000)]


@dataclass
class StreamOutcome:
    """What one client streamed and got back."""

    sent_samples: int = 0
    messages: list[dict[str, Any]] = field(default_factory=list)
    close_code: int | None = None

    @property
    def finals(self) -> list[dict[str, Any]]:
        return [m for m in self.messages if m["type"] == "final"]

    @property
    def done(self) -> dict[str, Any] | None:
        return next((m for m in self.messages if m["type"] == "done"), None)

    def unaccounted_samples(self) -> int:
        """Samples sent that ``done`` does not account for, plus samples ``done`` counts but does not account for
        (finals + non-speech + lost); also checks that the finals add up to the transcribed seconds."""
        done = self.done
        assert done is not None, f"no done message; close {self.close_code}, last {self.messages[-1:]}"
        received = round(done["audio_seconds_received"] * 16000)
        accounted = round(
            (done["audio_seconds_transcribed"] + done["non_speech_seconds"] + done["lost_seconds"]) * 16000
        )
        in_finals = round(sum(f["end"] - f["start"] for f in self.finals) * 16000)
        return (
            abs(self.sent_samples - received)
            + abs(received - accounted)
            + max(0, abs(in_finals - round(done["audio_seconds_transcribed"] * 16000)) - 2 * len(self.finals))
        )

    def seqs_in_order(self) -> bool:
        return [f["seq"] for f in self.finals] == list(range(1, len(self.finals) + 1))


async def stream(
    port: int,
    audio: npt.NDArray[np.float32],
    *,
    speed: float = 1.0,
    chunk_ms: int = 100,
    query: str = "",
    headers: Mapping[str, str] | None = None,
) -> StreamOutcome:
    """Stream ``audio`` (16 kHz PCM16) paced at ``speed`` times real time (0: at once), then ``end``; read every
    message until the close. ``headers`` go with the handshake (``Authorization`` on a server with API keys)."""
    outcome = StreamOutcome()
    url = f"ws://127.0.0.1:{port}/v1/listen{query}"
    async with ws_connect(url, max_queue=None, additional_headers=headers) as ws:

        async def read() -> None:
            with contextlib.suppress(ConnectionClosed):
                async for message in ws:
                    outcome.messages.append(json.loads(message))

        try:
            first = json.loads(await ws.recv())
        except ConnectionClosed:
            outcome.close_code = ws.close_code
            return outcome
        outcome.messages.append(first)
        reader = asyncio.create_task(read())
        try:
            if first["type"] == "ready":
                async for samples in paced_chunks(audio, 16 * chunk_ms, speed):
                    await ws.send(pcm16(samples))
                    outcome.sent_samples += len(samples)
                await ws.send('{"type":"end"}')
        except ConnectionClosed:
            pass
        await reader
    outcome.close_code = ws.close_code
    return outcome
