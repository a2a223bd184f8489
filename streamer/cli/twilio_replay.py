"""``streamer twilio-replay FILE --url ws://HOST:PORT/twilio``: play a recording to ``/twilio`` as Twilio would.

The file is loaded at 8 kHz; a stereo file with ``--stereo`` becomes a two-track call (left = inbound, the
customer; right = outbound, the agent), otherwise its mix is the inbound track. With ``--split-tracks`` each track
goes on a stream of its own, at the same time, as ``<Stream track="inbound_track">`` and ``<Stream
track="outbound_track">`` of one call would send them (the server merges them into one call).

The messages are those Twilio's Media Streams send (:func:`~streamer.integrations.twilio.recorded_messages`:
``connected``, ``start``, 20 ms ``media`` per track, ``stop``), paced at ``--speed`` times real time. With
``--auth-token`` the handshake carries the ``X-Twilio-Signature`` Twilio would compute for ``--url`` (or
``--signed-url``, the public URL behind a proxy). Prints the call's finals as they come, followed on
``/v1/calls/{callSid}/events``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import secrets
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import numpy as np
import numpy.typing as npt

from streamer.core.errors import AudioFileError, ConfigError
from streamer.integrations.twilio import CHUNK_MS, TWILIO_RATE, TrackName, recorded_messages, twilio_signature

__all__ = ["configure_parser", "load_tracks", "replay", "run"]


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", type=Path, help="audio file (any rate)")
    parser.add_argument("--url", default="ws://127.0.0.1:8765/twilio", help="the /twilio endpoint")
    parser.add_argument("--stereo", action="store_true", help="two tracks: left inbound, right outbound")
    parser.add_argument(
        "--split-tracks", action="store_true", help="with --stereo: one stream per track, both at once (one call)"
    )
    parser.add_argument("--speed", type=float, default=1.0, help="times real time; 0 sends as fast as possible")
    parser.add_argument("--call-sid", help="the callSid to use (default: a random CA...)")
    parser.add_argument("--auth-token", help="sign the handshake with this Twilio auth token")
    parser.add_argument("--signed-url", help="the URL to sign, when it differs from --url (default: --url as wss)")
    parser.add_argument("--api-key", help="API key for following the call's events")
    parser.add_argument("--quiet", action="store_true", help="do not follow and print the finals")


def load_tracks(path: Path, stereo: bool) -> dict[TrackName, npt.NDArray[np.float32]]:
    """The file's audio at 8 kHz per track."""
    import soundfile as sf

    from streamer.core.audio import resample

    try:
        data, rate = sf.read(path, dtype="float32", always_2d=True)
    except (OSError, RuntimeError) as error:
        raise AudioFileError(f"{path}: {error}") from None
    channels = [np.ascontiguousarray(data[:, i]) for i in range(data.shape[1])]
    if stereo:
        if len(channels) != 2:
            raise AudioFileError(f"{path} has {len(channels)} channels; --stereo needs 2")
        pairs = {TrackName.INBOUND: channels[0], TrackName.OUTBOUND: channels[1]}
    else:
        pairs = {TrackName.INBOUND: np.mean(np.stack(channels), axis=0).astype(np.float32)}
    return {track: resample(audio, rate, TWILIO_RATE) for track, audio in pairs.items()}


def _events_url(url: str, call_sid: str) -> str:
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, f"/v1/calls/{call_sid}/events", "", ""))


async def replay(
    url: str,
    tracks: dict[TrackName, npt.NDArray[np.float32]],
    *,
    call_sid: str,
    stream_sid: str | None = None,
    speed: float = 1.0,
    headers: dict[str, str] | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> int | None:
    """Send the call to ``url`` paced at ``speed`` (0: unpaced): each ``media`` message no earlier than its timestamp
    divided by ``speed`` from the start; returns the close code. The stream's ``streamSid`` is ``stream_sid``, or a
    new random one as Twilio gives each stream. ``clock`` and ``sleep`` are ``time.monotonic`` and ``asyncio.sleep``;
    tests pass a fake clock."""
    from websockets.asyncio.client import connect
    from websockets.exceptions import ConnectionClosed

    async with connect(url, additional_headers=headers or {}) as ws:
        started = clock()
        stream_sid = stream_sid or "MZ" + secrets.token_hex(16)
        for message in recorded_messages(tracks, call_sid=call_sid, stream_sid=stream_sid):
            if speed > 0 and message["event"] == "media":
                due = started + int(message["media"]["timestamp"]) / 1000 / speed
                delay = due - clock()
                if delay > 0:
                    await sleep(delay)
            await ws.send(json.dumps(message))
        with contextlib.suppress(ConnectionClosed):
            await ws.recv()
        return ws.close_code


async def _follow(url: str, headers: dict[str, str]) -> None:
    from websockets.asyncio.client import connect

    async with connect(url, additional_headers=headers) as ws:
        async for frame in ws:
            event: dict[str, Any] = json.loads(frame)
            if event["type"] == "final":
                print(f"[{event['start']:7.2f}] {event['label']:>8}: {event['text']}", flush=True)
            elif event["type"] in ("gap", "dtmf", "mark", "stream_started", "stream_ended", "call_ended", "error"):
                print(json.dumps(event), file=sys.stderr, flush=True)


async def _main(args: argparse.Namespace) -> int:
    tracks = load_tracks(args.file, args.stereo)
    call_sid = args.call_sid or "CA" + secrets.token_hex(16)
    headers: dict[str, str] = {}
    if args.auth_token:
        signed = args.signed_url or urlunsplit(("wss", *urlsplit(args.url)[1:]))
        headers["X-Twilio-Signature"] = twilio_signature(args.auth_token, signed)
    follower = None
    if not args.quiet:
        follow_headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
        follower = asyncio.ensure_future(_follow(_events_url(args.url, call_sid), follow_headers))
        await asyncio.sleep(0.2)
    seconds = max(len(a) for a in tracks.values()) / TWILIO_RATE
    print(f"replaying {seconds:.1f} s as {call_sid}: {len(tracks)} track(s), {CHUNK_MS} ms chunks", file=sys.stderr)
    if args.split_tracks:  # one stream per track, both at once
        codes = await asyncio.gather(
            *(
                replay(args.url, {name: audio}, call_sid=call_sid, speed=args.speed, headers=headers)
                for name, audio in tracks.items()
            )
        )
        code = next((c for c in codes if c != 1000), 1000)
    else:
        code = await replay(args.url, tracks, call_sid=call_sid, speed=args.speed, headers=headers)
    if follower is not None:
        try:
            await asyncio.wait_for(follower, 30)
        except TimeoutError:
            follower.cancel()
    print(f"closed with {code}", file=sys.stderr)
    return 0 if code == 1000 else 5


def run(args: argparse.Namespace) -> int:
    if args.speed < 0:
        raise ConfigError("--speed must be >= 0")
    if args.split_tracks and not args.stereo:
        raise ConfigError("--split-tracks needs --stereo: one stream per channel")
    return asyncio.run(_main(args))
