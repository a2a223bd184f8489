"""Embedding the streaming client: send a file in real time, print partials and finals as they come.

streamer serve &                      # in another terminal
python clients/python/example.py tests/data/1089-134686-0000.flac
"""

from __future__ import annotations

import asyncio
import sys

from streamer.client import connect
from streamer.offline.audiofile import load_audio
from streamer.server.protocol import Done, ErrorMessage, FinalMessage, PartialMessage

CHUNK = 1600  # 100 ms at 16 kHz


async def main(path: str, url: str = "ws://127.0.0.1:8765") -> None:
    samples = load_audio(path).samples  # float32 mono 16 kHz
    async with connect(url, sample_rate=16000, encoding="pcm_s16le") as client:
        print(f"connected: session {client.ready.session_id if client.ready else '?'}")

        async def send() -> None:
            for start in range(0, len(samples), CHUNK):
                await client.send_audio(samples[start : start + CHUNK])  # floats are encoded as pcm_s16le
                await asyncio.sleep(CHUNK / 16000)  # real time
            await client.end()

        sender = asyncio.create_task(send())
        async for message in client:
            if isinstance(message, PartialMessage):
                print(f"  ... {message.text.strip()}")
            elif isinstance(message, FinalMessage):
                span = f"{message.start:6.2f}-{message.end:6.2f}"
                print(f"[{span}] {message.text.strip()}  ({message.latency_ms:.0f} ms)")
            elif isinstance(message, ErrorMessage):
                print(f"error {message.code}: {message.message}")
            elif isinstance(message, Done):
                print(f"done: {message.audio_seconds_received:.1f} s, final p50 {message.latency.final.p50} ms")
        await sender


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:]))
