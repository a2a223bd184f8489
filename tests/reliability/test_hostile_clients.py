"""The hostile-client suite (issue 14): one property, over every endpoint a client can open.

For each thing a hostile or broken client does, on each endpoint where it means something, the suite asserts:

1. the server answers as ``docs/protocol.md`` says: an HTTP status for what the front door refuses at the handshake,
   else its ``error`` (OpenAI's ``error`` event on ``/v1/realtime``; none on ``/twilio``, which reads none) and its
   close code, or the session going on where the docs say it does;
2. the server's resident memory, read from ``/proc`` outside its process, peaks less than 50 MB above where it was
   when the case began (``VmHWM``, reset for each case, so that a spike between two samples counts too);
3. ``/healthz`` answers 200 throughout, probed back to back from a thread of its own. Its worst latency is in the
   reliability counts (the issue asks for 250 ms); the assertion is only a sanity bound ten times that, since the
   machines that run this suite are shared 2-core boxes;
4. a neighbouring ``/v1/listen`` stream of real speech (a committed clip, 4 times real time, within the audio rate
   limit's burst) gets the same words in its finals and the same accounting in ``done`` as when it runs alone.

The server is ``streamer serve`` in its own process, with the scripted engine (``scripted_server.py``) and two API
keys, started once for the module; the cases run one after another against it. The matrix (``-``: the case means
nothing there):

================================  ==========  ============  ========  ==========================  ===================
case                              /v1/listen  /v1/realtime  /twilio   /v1/calls/{callSid}/events  /deepgram/v1/listen
================================  ==========  ============  ========  ==========================  ===================
frame at the size limit           yes         yes           yes       yes (websockets' 4 MiB)     yes
frame one byte over               yes (x2)    yes           yes       yes                         yes (x2)
10 MB text frame                  yes         yes           yes       yes                         yes
deeply nested JSON                yes         yes           yes       yes                         yes
duplicated headers                yes         yes           yes       yes                         yes
a flood of tiny frames            yes         yes           yes       yes                         yes
a huge timestamp jump             -           -             yes       (its call_ended)            -
an unsupported language           yes         yes           -         -                           yes (HTTP 400)
a foreign Origin                  yes         yes           yes       yes                         yes
another credential's resume       yes         -             -         -                           -
a follower flood                  -           -             -         yes                         -
a client that stops reading       yes         yes           -         yes                         yes
================================  ==========  ============  ========  ==========================  ===================

``/twilio`` takes no language (Twilio sends none) and sends nothing back (a Media Stream is one-way), so neither an
unsupported language nor a reader that stops means anything there; only ``/v1/listen`` sessions can be resumed
(Deepgram streams cannot be, on Deepgram either); followers are the one admission class that a follower flood fills;
Deepgram's timestamps are the server's, not the client's.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import http.client
import json
import os
import re
import secrets
import socket
import sys
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from websockets.asyncio.client import ClientConnection
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed
from websockets.protocol import State

from streamer.bench.server_process import ServerProcess, free_port, running_server
from streamer.core.audio import encode_mulaw
from streamer.core.errors import ConfigError
from streamer.engine.speaker_encoder import weights_path
from streamer.integrations.twilio import TrackName, recorded_messages
from tests.conftest import load_clip
from tests.helpers import CLIP, pcm16, until
from tests.reliability.helpers import StreamOutcome, looped_speech, stream
from tests.reliability.tally import TALLY

pytestmark = pytest.mark.reliability

# ---------------------------------------------------------------------------------------------------------------------
# The server and its documented limits (docs/protocol.md, "Limits" and "One front door"): the values are written out
# here rather than imported, so that a change to the code that the docs do not follow fails here.

KEY = "hostile-suite-key-0000000000000001"
OTHER_KEY = "hostile-suite-key-0000000000000002"
AUTH = {"Authorization": f"Bearer {KEY}"}
OTHER_AUTH = {"Authorization": f"Bearer {OTHER_KEY}"}
FOREIGN_ORIGIN = "https://evil.example"

MAX_FRAME_BYTES = 1 << 20  # /v1/listen binary frame (--max-frame-bytes, its default)
MAX_MESSAGE_BYTES = 4 * MAX_FRAME_BYTES  # the WebSocket layer's limit on every connection
MAX_TEXT_CHARS = 16384  # /v1/listen text frame (docs/protocol.md, Limits: the largest valid configure fits)
MAX_EVENT_CHARS = 1_284_096  # /v1/realtime event
MAX_APPEND_BYTES = 960_000  # /v1/realtime append: 20 s of audio/pcm (24 kHz PCM16), the default format
MAX_TWILIO_CHARS = 64 * 1024  # /twilio message
MAX_DEPTH = 16  # JSON nesting, every endpoint
MAX_FOLLOWERS = 64  # --max-followers, its default
TEN_MB = 10_000_000

# ---------------------------------------------------------------------------------------------------------------------
# What is asserted, and the hang guards

RSS_GROWTH_MB = 50.0
# the issue asks /healthz to answer within 250 ms; asserted only ten times that (a shared 2-core machine), reported
HEALTHZ_SANITY_SECONDS = 2.5
PROBE_INTERVAL_SECONDS = 0.02  # between two /healthz probes (pacing, not synchronisation)
# only guards against a hang: a case that waits this long shows a server that never answered
HANG_SECONDS = 120.0
NEIGHBOUR_SPEED = 4.0  # times real time: 10.4 s of speech in 2.6 s, well within the rate limit's 60 s burst

END = '{"type": "end"}'
CLEAR = '{"type": "input_audio_buffer.clear"}'
READ_ONLY = "this socket is read-only"

# the error close a client sees when the connection ends, whatever its code (see Answer)
ENDED = -1


@dataclass(frozen=True)
class Answer:
    """What the server answered a hostile client, in the terms of docs/protocol.md.

    ``error``: the code of the ``error`` the client got last (``error.code`` of OpenAI's event on ``/v1/realtime``;
    the close reason on ``/twilio``, which gets no messages), None for none. ``close``: the close code, None while
    the connection goes on, :data:`ENDED` in an expectation that takes any close. ``message``: the error's message or
    the HTTP body; an expectation's ``message`` only has to be part of it. ``status``: the HTTP status of a
    handshake the front door refused (None: the handshake went through).
    """

    error: str | None = None
    close: int | None = None
    message: str = ""
    status: int | None = None

    def matches(self, seen: Answer) -> bool:
        close_matches = seen.close is not None if self.close == ENDED else seen.close == self.close
        return (self.status, self.error) == (seen.status, seen.error) and close_matches and self.message in seen.message


class WrongAnswer(AssertionError):
    """The server's answers are not the documented ones: the only failure a row's known bug excuses (a hang, a
    neighbour harmed or memory grown are failures whatever the row)."""


def assert_answers(seen: Sequence[Answer], expected: Sequence[Answer]) -> None:
    if len(seen) != len(expected) or not all(e.matches(s) for s, e in zip(seen, expected, strict=True)):
        raise WrongAnswer(f"\n  seen:     {list(seen)}\n  expected: {list(expected)}")


def answer_of(messages: Sequence[dict[str, Any]], ws: ClientConnection) -> Answer:
    """The last ``error`` among ``messages`` (either protocol's shape) and the connection's close code."""
    errors = [m.get("error") if isinstance(m.get("error"), dict) else m for m in messages if m["type"] == "error"]
    last = errors[-1] if errors else {}
    return Answer(error=last.get("code"), close=ws.close_code, message=str(last.get("message", "")))


# ---------------------------------------------------------------------------------------------------------------------
# The server, watched from outside


class ServerLog:
    """The server's log, read as it grows without moving the file offset the server writes at."""

    def __init__(self, server: ServerProcess) -> None:
        self._fd = server.log.fileno()
        self._read = os.fstat(self._fd).st_size  # what was there before is not news
        self._text = ""

    def has(self, *needles: str) -> bool:
        """Whether any of ``needles`` was logged since this reader was made."""
        self._read_more()
        return any(needle in self._text for needle in needles)

    def search(self, pattern: str) -> re.Match[str] | None:
        """The first match of ``pattern`` in what was logged since this reader was made."""
        self._read_more()
        return re.search(pattern, self._text)

    def _read_more(self) -> None:
        size = os.fstat(self._fd).st_size
        if size > self._read:
            self._text += os.pread(self._fd, size - self._read, self._read).decode("utf-8", "replace")
            self._read = size


class Watch:
    """While a case runs: ``/healthz`` probed back to back and the server's RSS sampled, from a thread of its own
    (the test's event loop is busy with the case), and the peak resident size (``VmHWM``, reset on entry)."""

    def __init__(self, server: ServerProcess) -> None:
        self.server = server
        self.latencies: list[float] = []
        self.failures: list[str] = []
        self.before_mb = 0.0
        self.peak_mb = 0.0
        self._hwm_reset = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._probe, name="healthz-probe", daemon=True)

    @property
    def growth_mb(self) -> float:
        return self.peak_mb - self.before_mb

    @property
    def worst_healthz(self) -> float:
        return max(self.latencies, default=0.0)

    def __enter__(self) -> Watch:
        pid = self.server.process.pid
        try:  # "5" resets VmHWM to the current RSS (proc(5), clear_refs)
            Path(f"/proc/{pid}/clear_refs").write_text("5")
            self._hwm_reset = True
        except OSError:  # not ours to reset: the samples alone give the peak
            pass
        self.before_mb = self.peak_mb = self.server.memory().rss_mb
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        memory = self.server.memory()
        self.peak_mb = max(self.peak_mb, memory.hwm_mb if self._hwm_reset else memory.rss_mb)

    def _probe(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            connection = http.client.HTTPConnection("127.0.0.1", self.server.port, timeout=HANG_SECONDS)
            try:
                connection.request("GET", "/healthz")
                status = connection.getresponse().status
                if status != 200:
                    self.failures.append(f"/healthz answered {status}")
            except OSError as error:
                self.failures.append(f"/healthz failed: {error!r}")
            finally:
                connection.close()
            self.latencies.append(time.monotonic() - started)
            self.peak_mb = max(self.peak_mb, self.server.memory().rss_mb)
            self._stop.wait(PROBE_INTERVAL_SECONDS)


@dataclass(frozen=True)
class Transcript:
    """What a /v1/listen stream got that its neighbours must not change: the words of its finals and ``done``'s
    accounting. (Not where the finals split: which agreed words a final commits depends on when decodes come back,
    so the split moves with the load, while the words and every second's accounting do not.)"""

    words: tuple[str, ...]
    received: float
    transcribed: float
    non_speech: float
    lost: float
    close_code: int | None

    @classmethod
    def of(cls, outcome: StreamOutcome) -> Transcript:
        done = outcome.done or {}
        return cls(
            tuple(word for f in outcome.finals for word in f["text"].split()),
            done.get("audio_seconds_received", -1.0),
            done.get("audio_seconds_transcribed", -1.0),
            done.get("non_speech_seconds", -1.0),
            done.get("lost_seconds", -1.0),
            outcome.close_code,
        )


def neighbour(port: int) -> Awaitable[StreamOutcome]:
    return stream(port, load_clip(CLIP), speed=NEIGHBOUR_SPEED, headers=AUTH)


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    """``streamer serve`` on the scripted engine with two API keys, in its own process, for the whole module."""
    port = free_port()
    script = Path(__file__).with_name("scripted_server.py")
    command = [sys.executable, str(script), "--port", str(port), "--api-key", KEY, "--api-key", OTHER_KEY]
    command += ["--twilio-call-grace", "0"]  # a call ends with its one stream: its followers close at once
    with running_server(command, port, ready_timeout=HANG_SECONDS) as process:
        yield process


@pytest.fixture(scope="module")
def alone(server: ServerProcess) -> Transcript:
    """The neighbour's stream with nothing else on the server: what it must get beside every case."""
    transcript = Transcript.of(asyncio.run(neighbour(server.port)))
    assert transcript.close_code == 1000 and transcript.words, transcript
    return transcript


# ---------------------------------------------------------------------------------------------------------------------
# Clients of each endpoint


def ws_url(port: int, path: str) -> str:
    return f"ws://127.0.0.1:{port}{path}"


@contextlib.asynccontextmanager
async def connected(port: int, path: str, **options: Any) -> AsyncIterator[ClientConnection]:
    """``websockets.connect`` as a context, closing on the way out only a connection the server has not closed
    (websockets' ``close()`` raises AttributeError on one the server closed during a large send)."""
    ws = await ws_connect(ws_url(port, path), **options)
    try:
        yield ws
    finally:
        if ws.state is not State.CLOSED:
            with contextlib.suppress(ConnectionClosed):
                await ws.close()


REALTIME = "/v1/realtime?intent=transcription"


def events_path(call_sid: str) -> str:
    return f"/v1/calls/{call_sid}/events"


async def read_rest(ws: ClientConnection, into: list[dict[str, Any]]) -> None:
    """Every message until the connection closes."""
    with contextlib.suppress(ConnectionClosed):
        async for message in ws:
            into.append(json.loads(message))


async def send(ws: ClientConnection, frame: str | bytes) -> bool:
    """Send ``frame`` unless the server has closed the connection; whether it was sent. (The state is checked first:
    on a connection the server closed during a large send, websockets' ``send()`` raises AttributeError.)"""
    if ws.state is not State.OPEN:
        return False
    try:
        await ws.send(frame)
    except ConnectionClosed:
        return False
    return True


async def send_all(ws: ClientConnection, frames: Sequence[str | bytes]) -> None:
    """Send ``frames``; stop quietly if the server closes the connection on one of them."""
    for frame in frames:
        if not await send(ws, frame):
            return


async def listen(
    port: int, frames: Sequence[str | bytes], query: str = "", headers: dict[str, str] = AUTH
) -> tuple[Answer, list[dict[str, Any]]]:
    """A /v1/listen stream: its first message (``ready``, or the error of a refusal), then ``frames``, then every
    message until the server closes."""
    async with connected(port, f"/v1/listen{query}", additional_headers=headers, max_queue=None) as ws:
        messages: list[dict[str, Any]] = []
        with contextlib.suppress(ConnectionClosed):
            messages.append(json.loads(await ws.recv()))
            await send_all(ws, frames)
        await read_rest(ws, messages)
    return answer_of(messages, ws), messages


async def realtime(port: int, frames: Sequence[str]) -> tuple[Answer, ...]:
    """A /v1/realtime session: after each frame a ``clear``, whose ``cleared`` shows that the session goes on; the
    answer to each frame is the error event it got (if any), or the close that ended the session."""
    answers: list[Answer] = []
    async with connected(port, REALTIME, additional_headers=AUTH, max_queue=None) as ws:
        assert json.loads(await ws.recv())["type"] == "session.created"
        for frame in frames:
            events: list[dict[str, Any]] = []
            if await send(ws, frame) and await send(ws, CLEAR):
                with contextlib.suppress(ConnectionClosed):
                    while (event := json.loads(await ws.recv()))["type"] != "input_audio_buffer.cleared":
                        events.append(event)
            if ws.state is not State.OPEN:
                await read_rest(ws, events)
                answers.append(answer_of(events, ws))
                break
            answers.append(answer_of(events, ws))
    return tuple(answers)


def twilio_opening(call_sid: str, tracks: Sequence[TrackName] = (TrackName.INBOUND,)) -> list[str]:
    """Twilio's ``connected`` and ``start`` for a call of ``tracks``."""
    silence = {track: np.zeros(160, dtype=np.float32) for track in tracks}
    messages = recorded_messages(silence, call_sid=call_sid)
    return [json.dumps(next(messages)), json.dumps(next(messages))]


def twilio_media(track: TrackName, timestamp_ms: int, payload: bytes, pad_to: int = 0) -> str:
    """A ``media`` message; ``pad_to`` characters long with whitespace inside the JSON (still valid JSON)."""
    media = {"track": track.value, "timestamp": str(timestamp_ms), "payload": base64.b64encode(payload).decode()}
    message = json.dumps({"event": "media", "media": media})
    return padded(message[:-1], pad_to) if pad_to else message


TWILIO_STOP = json.dumps({"event": "stop", "stop": {}})


async def twilio(port: int, frames: Sequence[str], follower: Follower | None = None) -> Answer:
    """A Twilio Media Stream sending ``frames``; its answer is the close (Twilio gets no messages back). With a
    ``follower``, the stream waits after its opening (``connected``, ``start``) until the follower has
    ``call_started``: it then follows every event of the call."""
    async with connected(port, "/twilio") as ws:
        if follower is not None:
            await send_all(ws, frames[:2])
            assert (await follower.next())["type"] == "call_started"
            frames = frames[2:]
        await send_all(ws, frames)
        with contextlib.suppress(ConnectionClosed):
            async with asyncio.timeout(HANG_SECONDS):
                await ws.recv()  # never a message: this waits for the close
    # the close reason is the error's code, but on 1000 (stopped) and on the WebSocket layer's closes (a sentence)
    reason = ws.close_reason or ""
    return Answer(error=reason if ws.close_code != 1000 and " " not in reason else None, close=ws.close_code)


class Follower:
    """A ``/v1/calls/{callSid}/events`` follower, connected and subscribed before the call starts."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self.events: list[dict[str, Any]] = []

    @classmethod
    @contextlib.asynccontextmanager
    async def of(cls, port: int, call_sid: str, **connect: Any) -> Any:
        async with connected(port, events_path(call_sid), additional_headers=AUTH, **connect) as ws:
            yield cls(ws)

    async def next(self) -> dict[str, Any]:
        event: dict[str, Any] = json.loads(await self.ws.recv())
        self.events.append(event)
        return event

    async def until_closed(self) -> Answer:
        await read_rest(self.ws, self.events)
        return answer_of(self.events, self.ws)

    def call_ended(self) -> dict[str, Any]:
        ended = [e for e in self.events if e["type"] == "call_ended"]
        assert ended, f"no call_ended among {len(self.events)} events; close {self.ws.close_code}"
        return ended[-1]


async def follower_sending(port: int, frames: Sequence[str]) -> Answer:
    async with Follower.of(port, f"CA{secrets.token_hex(8)}") as follower:
        await send_all(follower.ws, frames)
        return await follower.until_closed()


async def handshake(port: int, path: str, headers: Sequence[tuple[str, str]]) -> Answer:
    """A WebSocket opening handshake carrying exactly ``headers`` (repeated names included) on a raw socket; the
    answer is the HTTP status and body (101: the handshake went through)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        lines = [f"GET {path} HTTP/1.1", "Upgrade: websocket", "Connection: Upgrade", "Sec-WebSocket-Version: 13"]
        lines += [f"{name}: {value}" for name, value in headers]
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode())
        async with asyncio.timeout(HANG_SECONDS):
            head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
            status_line, *fields = head.strip().split("\r\n")
            length = next(
                (int(v) for k, _, v in (f.partition(":") for f in fields) if k.lower() == "content-length"), 0
            )
            status = int(status_line.split()[1])
            body = await reader.readexactly(length) if status != 101 else b""
        return Answer(status=status, message=body.decode("utf-8", "replace").strip())
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


def usual_headers(port: int) -> list[tuple[str, str]]:
    key = base64.b64encode(secrets.token_bytes(16)).decode()
    return [("Host", f"127.0.0.1:{port}"), ("Sec-WebSocket-Key", key), ("Authorization", f"Bearer {KEY}")]


def padded(prefix: str, length: int, suffix: str = "}") -> str:
    """``prefix`` + spaces + ``suffix``, exactly ``length`` characters: valid JSON when the parts make an object."""
    return prefix + " " * (length - len(prefix) - len(suffix)) + suffix


def append_event(audio: bytes, pad_to: int = 0) -> str:
    prefix = json.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(audio).decode()})[:-1]
    return padded(prefix, pad_to) if pad_to else prefix + "}"


def nested(prefix: str, depth: int) -> str:
    """``prefix`` + ``depth`` nested arrays + ``}``."""
    return prefix + "[" * depth + "]" * depth + "}"


async def stream_slots_but_listen(port: int) -> int:
    """Stream slots held by connections other than this key's /v1/listen sessions (GET /status: the engine counts
    every stream slot, and each key sees its own /v1/listen sessions)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET /status HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer {KEY}\r\n\r\n".encode())
    raw = await reader.read()
    writer.close()
    status = json.loads(raw.partition(b"\r\n\r\n")[2])
    listening = sum(1 for s in status["sessions"] if s["kind"] == "listen")
    slots: int = status["engine"]["active_sessions"]
    return slots - listening


# ---------------------------------------------------------------------------------------------------------------------
# The cases. Each takes the server and returns the answers the client saw, in order.

Act = Callable[[ServerProcess], Awaitable[tuple[Answer, ...]]]


async def listen_frames_at_the_limit(server: ServerProcess) -> tuple[Answer, ...]:
    frames = [bytes(MAX_FRAME_BYTES), padded('{"type": "keepalive"', MAX_TEXT_CHARS), END]
    answer, messages = await listen(server.port, frames)
    done = next(m for m in messages if m["type"] == "done")
    assert done["audio_seconds_received"] == pytest.approx(MAX_FRAME_BYTES / 2 / 16000, abs=1e-3)
    return (answer,)


async def listen_diarized_speech_at_the_limit(server: ServerProcess) -> tuple[Answer, ...]:
    # speech, so that the speaker model embeds every window of it: 32 s in one frame, on a diarized session
    speech = pcm16(np.resize(load_clip(CLIP), MAX_FRAME_BYTES // 2))
    answer, messages = await listen(server.port, [speech, END], query="?diarize=true")
    if Answer("diarization_unavailable", 4415).matches(answer):
        return (answer,)  # no speaker model installed: the documented refusal (the row expects it then)
    done = next(m for m in messages if m["type"] == "done")
    assert done["audio_seconds_received"] == pytest.approx(MAX_FRAME_BYTES / 2 / 16000, abs=1e-3)
    return (answer,)


def speaker_model_installed() -> bool:
    try:
        weights_path()
    except ConfigError:
        return False
    return True


async def listen_binary_frame_one_byte_over(server: ServerProcess) -> tuple[Answer, ...]:
    return ((await listen(server.port, [bytes(MAX_FRAME_BYTES + 1)]))[0],)


async def listen_text_frame_one_byte_over(server: ServerProcess) -> tuple[Answer, ...]:
    return ((await listen(server.port, [padded('{"type": "keepalive"', MAX_TEXT_CHARS + 1)]))[0],)


async def realtime_event_at_the_limit(server: ServerProcess) -> tuple[Answer, ...]:
    # the largest append there is, in an event padded to the largest event there is
    return await realtime(server.port, [append_event(bytes(MAX_APPEND_BYTES), pad_to=MAX_EVENT_CHARS)])


async def realtime_one_byte_over(server: ServerProcess) -> tuple[Answer, ...]:
    event_over = append_event(bytes(2), pad_to=MAX_EVENT_CHARS + 1)
    return await realtime(server.port, [event_over, append_event(bytes(MAX_APPEND_BYTES + 1))])


def twilio_media_of(length: int) -> list[str]:
    call_sid = f"CA{secrets.token_hex(8)}"
    media = twilio_media(TrackName.INBOUND, 0, bytes([0xFF]) * 8000, pad_to=length)  # 1 s of mu-law silence
    return [*twilio_opening(call_sid), media, TWILIO_STOP]


async def twilio_message_at_the_limit(server: ServerProcess) -> tuple[Answer, ...]:
    return (await twilio(server.port, twilio_media_of(MAX_TWILIO_CHARS)),)


async def twilio_message_one_byte_over(server: ServerProcess) -> tuple[Answer, ...]:
    return (await twilio(server.port, twilio_media_of(MAX_TWILIO_CHARS + 1)),)


async def follower_message_at_the_limit(server: ServerProcess) -> tuple[Answer, ...]:
    return (await follower_sending(server.port, ["x" * MAX_MESSAGE_BYTES]),)


async def follower_message_one_byte_over(server: ServerProcess) -> tuple[Answer, ...]:
    return (await follower_sending(server.port, ["x" * (MAX_MESSAGE_BYTES + 1)]),)


async def listen_ten_mb(server: ServerProcess) -> tuple[Answer, ...]:
    return ((await listen(server.port, ["x" * TEN_MB]))[0],)


async def realtime_ten_mb(server: ServerProcess) -> tuple[Answer, ...]:
    return await realtime(server.port, ["x" * TEN_MB])


async def twilio_ten_mb(server: ServerProcess) -> tuple[Answer, ...]:
    return (await twilio(server.port, [*twilio_opening(f"CA{secrets.token_hex(8)}"), "x" * TEN_MB]),)


async def follower_ten_mb(server: ServerProcess) -> tuple[Answer, ...]:
    return (await follower_sending(server.port, ["x" * TEN_MB]),)


# as deep as each endpoint's largest text frame allows: the check must cost a pass over the text, not a recursion
LISTEN_DEPTH = (MAX_TEXT_CHARS - 20) // 2
REALTIME_DEPTH = (MAX_EVENT_CHARS - 100) // 2
TWILIO_DEPTH = (MAX_TWILIO_CHARS - 100) // 2


async def listen_deep_json(server: ServerProcess) -> tuple[Answer, ...]:
    return ((await listen(server.port, [nested('{"type": ', LISTEN_DEPTH)]))[0],)


async def realtime_deep_json(server: ServerProcess) -> tuple[Answer, ...]:
    return await realtime(server.port, [nested('{"type": "input_audio_buffer.append", "audio": ', REALTIME_DEPTH)])


async def twilio_deep_json(server: ServerProcess) -> tuple[Answer, ...]:
    frames = [*twilio_opening(f"CA{secrets.token_hex(8)}"), nested('{"event": "media", "media": ', TWILIO_DEPTH)]
    return (await twilio(server.port, frames),)


async def follower_deep_json(server: ServerProcess) -> tuple[Answer, ...]:
    return (await follower_sending(server.port, [nested('{"a": ', TWILIO_DEPTH)]),)


DUPLICABLE = ("Host", "Origin", "Authorization", "X-Twilio-Signature", "Sec-WebSocket-Key")


def duplicated_headers(path: str) -> Act:
    async def act(server: ServerProcess) -> tuple[Answer, ...]:
        answers = []
        for name in DUPLICABLE:
            headers = usual_headers(server.port)
            same = f"http://127.0.0.1:{server.port}"
            twice = {
                "Host": [("Host", "evil.example")],
                "Origin": [("Origin", same), ("Origin", FOREIGN_ORIGIN)],
                "Authorization": [("Authorization", f"Bearer {OTHER_KEY}")],
                "X-Twilio-Signature": [("X-Twilio-Signature", "a"), ("X-Twilio-Signature", "b")],
                "Sec-WebSocket-Key": [("Sec-WebSocket-Key", base64.b64encode(secrets.token_bytes(16)).decode())],
            }[name]
            answers.append(await handshake(server.port, path, [*headers, *twice]))
        return tuple(answers)

    return act


def foreign_origin(path: str) -> Act:
    async def act(server: ServerProcess) -> tuple[Answer, ...]:
        return (await handshake(server.port, path, [*usual_headers(server.port), ("Origin", FOREIGN_ORIGIN)]),)

    return act


TINY_FRAMES = 16_000


async def listen_tiny_frames(server: ServerProcess) -> tuple[Answer, ...]:
    answer, messages = await listen(server.port, [bytes(2)] * TINY_FRAMES + [END])  # one sample a frame
    done = next(m for m in messages if m["type"] == "done")
    assert done["audio_seconds_received"] == pytest.approx(TINY_FRAMES / 16000, abs=1e-3)
    return (answer,)


async def realtime_tiny_frames(server: ServerProcess) -> tuple[Answer, ...]:
    port = server.port
    async with connected(port, REALTIME, additional_headers=AUTH, max_queue=None) as ws:
        await ws.recv()  # session.created
        await send_all(ws, [append_event(bytes(2))] * TINY_FRAMES)  # one sample an append
    # every one of them was taken without an error: the session went on (realtime() checks that with a clear)
    return await realtime(port, [append_event(bytes(2))] * 2)


async def twilio_tiny_frames(server: ServerProcess) -> tuple[Answer, ...]:
    call_sid = f"CA{secrets.token_hex(8)}"
    media = [twilio_media(TrackName.INBOUND, ms, bytes([0xFF]) * 8) for ms in range(TINY_FRAMES)]  # 1 ms each
    async with Follower.of(server.port, call_sid) as follower:
        call = await twilio(server.port, [*twilio_opening(call_sid), *media, TWILIO_STOP], follower)
        followed = await follower.until_closed()
    counts = follower.call_ended()["data"]["tracks"]["inbound"]
    assert (counts["chunks"], counts["samples"], counts["gaps"], counts["late_samples"]) == (
        TINY_FRAMES,
        TINY_FRAMES * 8,
        0,
        0,
    )
    return call, followed


async def follower_tiny_frames(server: ServerProcess) -> tuple[Answer, ...]:
    return (await follower_sending(server.port, ["."] * TINY_FRAMES),)


async def twilio_timestamp_jump(server: ServerProcess) -> tuple[Answer, ...]:
    call_sid = f"CA{secrets.token_hex(8)}"
    silence = bytes([0xFF]) * 160  # 20 ms
    media = [twilio_media(TrackName.INBOUND, 0, silence), twilio_media(TrackName.INBOUND, 1_000_000, silence)]
    async with Follower.of(server.port, call_sid) as follower:
        call = await twilio(server.port, [*twilio_opening(call_sid), *media], follower)
        followed = await follower.until_closed()
    assert follower.call_ended()["data"]["reason"] == "media_gap_too_long"
    return call, followed


async def listen_unsupported_language(server: ServerProcess) -> tuple[Answer, ...]:
    return ((await listen(server.port, [END], query="?language=fr"))[0],)


def session_update(**transcription: str) -> str:
    """A GA ``session.update``: G.711 mu-law, turn detection off, ``transcription`` fields if any."""
    audio_input: dict[str, Any] = {"format": {"type": "audio/pcmu"}, "turn_detection": None}
    if transcription:
        audio_input["transcription"] = transcription
    return json.dumps({"type": "session.update", "session": {"type": "transcription", "audio": {"input": audio_input}}})


async def realtime_unsupported_language(server: ServerProcess) -> tuple[Answer, ...]:
    async with connected(server.port, REALTIME, additional_headers=AUTH, max_queue=None) as ws:
        await ws.recv()  # session.created
        await ws.send(session_update(language="fr"))  # the model is English-only
        answer = answer_of([json.loads(await ws.recv())], ws)
        # Either way the session goes on: speech appended and committed gets its item completed (with the language
        # kept if the server took it, which the engine cannot decode).
        await ws.send(session_update())
        speech = encode_mulaw(load_clip(CLIP)[: 3 * 16000 : 2])  # 3 s, every other sample: 8 kHz
        await send_all(ws, [append_event(speech), '{"type": "input_audio_buffer.commit"}'])
        completed = "conversation.item.input_audio_transcription.completed"
        while json.loads(await ws.recv())["type"] != completed:
            pass
    return (answer,)


async def listen_resume_with_another_key(server: ServerProcess) -> tuple[Answer, ...]:
    log = ServerLog(server)
    ws = await ws_connect(ws_url(server.port, "/v1/listen"), additional_headers=AUTH)
    session_id = json.loads(await ws.recv())["session_id"]
    await ws.send(pcm16(looped_speech(1.0)))
    ws.transport.abort()  # the connection drops without a close: the session parks for its grace period
    await ws.wait_closed()
    await until(lambda: log.has(f"session={session_id} event=parked"), HANG_SECONDS)
    resume = f"?resume={session_id}&last_seq=0"
    other, _ = await listen(server.port, [END], resume, OTHER_AUTH)
    own, messages = await listen(server.port, [END], resume)  # the owner still can: the refusal left it parked
    assert messages[0]["type"] == "ready" and messages[0]["resumed"] is True, messages[:1]
    return other, own


FLOOD_EXTRA = 8  # followers past --max-followers


async def follower_flood(server: ServerProcess) -> tuple[Answer, ...]:
    port = server.port
    ended = f"CA{secrets.token_hex(8)}"  # a call that has ended: a follower gets its history and close 1000 at once
    assert await twilio(port, [*twilio_opening(ended), TWILIO_STOP]) == Answer(close=1000)
    waiting = f"CA{secrets.token_hex(8)}"  # a call that has not started: its followers wait
    async with contextlib.AsyncExitStack() as stack:
        followers = [await stack.enter_async_context(Follower.of(port, waiting)) for _ in range(MAX_FOLLOWERS)]
        refused = [await follower_sending(port, []) for _ in range(FLOOD_EXTRA)]
        assert all(f.ws.close_code is None for f in followers), "a follower within the limit was refused"
    # the slots come back once the followers have left (polled: the server lets go of them after their close)
    while (again := await follower_of_ended_call(port, ended)).error == "at_capacity":
        pass
    return (*refused, again)


async def follower_of_ended_call(port: int, call_sid: str) -> Answer:
    async with Follower.of(port, call_sid) as follower:
        return await follower.until_closed()


def tiny_receiver(port: int) -> socket.socket:
    """A connected socket whose receive buffer is as small as the kernel allows: a client that stops reading
    fills it at once."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    return sock


FINALIZE = '{"type": "finalize"}'
UNREAD_SECONDS = 58.0  # of speech the stopped reader sends, within the rate limit's 60 s burst


async def listen_stops_reading(server: ServerProcess) -> tuple[Answer, ...]:
    log = ServerLog(server)
    options = {"sock": tiny_receiver(server.port), "additional_headers": AUTH, "max_queue": 4}
    async with connected(server.port, "/v1/listen?channels=2", **options) as ws:
        session_id = json.loads(await ws.recv())["session_id"]
        # stereo and a finalize every 20 ms: two finals each time, about 10 kB of messages a second of audio
        stereo = pcm16(np.repeat(looped_speech(UNREAD_SECONDS), 2))
        step = 20 * 16 * 2 * 2  # 20 ms of 16 kHz stereo PCM16
        await send_all(ws, [f for at in range(0, len(stereo), step) for f in (stereo[at : at + step], FINALIZE)])
        # the server gives up on the session: it logs the send that timed out, or the session's end (when only
        # finals fill its send buffer), whichever comes first
        gave_up = (f"session={session_id} event=slow_reader", f"session={session_id} event=closed")
        await until(lambda: log.has(*gave_up), HANG_SECONDS)
        messages: list[dict[str, Any]] = []
        await read_rest(ws, messages)  # the client reads again: what was buffered, then the server's answer
    return (answer_of(messages, ws),)


UNREAD_EVENTS = 40_000  # each answered with an error event of about 250 bytes: 10 MB, past any socket's buffers


async def realtime_stops_reading(server: ServerProcess) -> tuple[Answer, ...]:
    port = server.port
    others = await stream_slots_but_listen(port)
    options = {"sock": tiny_receiver(port), "additional_headers": AUTH, "max_queue": 4}
    async with connected(port, REALTIME, **options) as ws:
        await ws.recv()  # session.created
        await send_all(ws, ['{"type": "nope"}'] * UNREAD_EVENTS)
        # nothing the server says can reach this client, and it logs nothing: the sign that it gave up on the
        # session is the session's stream slot coming back (GET /status)
        while await stream_slots_but_listen(port) > others:
            await asyncio.sleep(0.05)
        events: list[dict[str, Any]] = []
        await read_rest(ws, events)
    assert len(events) < UNREAD_EVENTS, "the server queued an answer to every event for a client that read none"
    return (Answer(close=ws.close_code),)


# media per track, each 3 ms after the last and empty: 3 ms of lost media (past the 2 ms of jitter ignored) and a gap
# event each, about 6 MB of events for both tracks; 54 s of call, within the rate limit's 60 s burst
UNREAD_GAPS = 18_000


async def follower_stops_reading(server: ServerProcess) -> tuple[Answer, ...]:
    port = server.port
    call_sid = f"CA{secrets.token_hex(8)}"
    tracks = (TrackName.INBOUND, TrackName.OUTBOUND)
    media = [twilio_media(track, 3 * i, b"") for i in range(1, UNREAD_GAPS + 1) for track in tracks]
    async with Follower.of(port, call_sid, sock=tiny_receiver(port), max_queue=4) as follower:
        call = await twilio(port, [*twilio_opening(call_sid, tracks), *media, TWILIO_STOP], follower)
        followed = await follower.until_closed()  # the call is over: the follower reads again
    return call, followed


# /deepgram/v1/listen: Deepgram's shapes (an ``Error`` with ``variant`` and ``description``), the same limits as
# /v1/listen (its route row's policy), a query refused with HTTP 400 before the handshake

DEEPGRAM = "/deepgram/v1/listen"
DEEPGRAM_QUERY = "?encoding=linear16&sample_rate=16000"
CLOSE_STREAM = '{"type": "CloseStream"}'


def deepgram_answer(messages: Sequence[dict[str, Any]], ws: ClientConnection) -> Answer:
    """The last ``Error`` among ``messages`` and the connection's close code."""
    errors = [m for m in messages if m["type"] == "Error"]
    last = errors[-1] if errors else {}
    return Answer(error=last.get("variant"), close=ws.close_code, message=str(last.get("description", "")))


async def deepgram(port: int, frames: Sequence[str | bytes], query: str = DEEPGRAM_QUERY) -> list[dict[str, Any]]:
    """A Deepgram stream (Deepgram says nothing before the audio): ``frames``, then every message until the close;
    the answer is the last message's, :func:`deepgram_answer`."""
    async with connected(port, f"{DEEPGRAM}{query}", additional_headers=AUTH, max_queue=None) as ws:
        messages: list[dict[str, Any]] = []
        await send_all(ws, frames)
        await read_rest(ws, messages)
    messages.append({"type": "_close", "answer": deepgram_answer(messages, ws)})
    return messages


def answered(messages: list[dict[str, Any]]) -> Answer:
    answer: Answer = messages[-1]["answer"]
    return answer


def metadata(messages: list[dict[str, Any]]) -> dict[str, Any]:
    return next(m for m in messages if m["type"] == "Metadata")


async def deepgram_frames_at_the_limit(server: ServerProcess) -> tuple[Answer, ...]:
    frames = [bytes(MAX_FRAME_BYTES), padded('{"type": "KeepAlive"', MAX_TEXT_CHARS), CLOSE_STREAM]
    messages = await deepgram(server.port, frames)
    assert metadata(messages)["duration"] == pytest.approx(MAX_FRAME_BYTES / 2 / 16000, abs=1e-3)
    return (answered(messages),)


async def deepgram_binary_frame_one_byte_over(server: ServerProcess) -> tuple[Answer, ...]:
    return (answered(await deepgram(server.port, [bytes(MAX_FRAME_BYTES + 1)])),)


async def deepgram_text_frame_one_byte_over(server: ServerProcess) -> tuple[Answer, ...]:
    return (answered(await deepgram(server.port, [padded('{"type": "KeepAlive"', MAX_TEXT_CHARS + 1)])),)


async def deepgram_ten_mb(server: ServerProcess) -> tuple[Answer, ...]:
    return (answered(await deepgram(server.port, ["x" * TEN_MB])),)


async def deepgram_deep_json(server: ServerProcess) -> tuple[Answer, ...]:
    # Deepgram's SchemaError: the stream goes on, and CloseStream ends it cleanly
    return (answered(await deepgram(server.port, [nested('{"type": ', LISTEN_DEPTH), CLOSE_STREAM])),)


async def deepgram_tiny_frames(server: ServerProcess) -> tuple[Answer, ...]:
    messages = await deepgram(server.port, [bytes(2)] * TINY_FRAMES + [CLOSE_STREAM])  # one sample a frame
    assert metadata(messages)["duration"] == pytest.approx(TINY_FRAMES / 16000, abs=1e-3)
    return (answered(messages),)


async def deepgram_unsupported_language(server: ServerProcess) -> tuple[Answer, ...]:
    path = f"{DEEPGRAM}{DEEPGRAM_QUERY}&language=fr"
    return (await handshake(server.port, path, usual_headers(server.port)),)


async def deepgram_stops_reading(server: ServerProcess) -> tuple[Answer, ...]:
    log = ServerLog(server)
    options = {"sock": tiny_receiver(server.port), "additional_headers": AUTH, "max_queue": 4}
    query = f"{DEEPGRAM_QUERY}&channels=2&multichannel=true&interim_results=true"
    async with connected(server.port, f"{DEEPGRAM}{query}", **options) as ws:
        # stereo and a Finalize every 20 ms: a final per channel each time, as /v1/listen's case sends
        stereo = pcm16(np.repeat(looped_speech(UNREAD_SECONDS), 2))
        step = 20 * 16 * 2 * 2  # 20 ms of 16 kHz stereo PCM16
        finalize = '{"type": "Finalize"}'
        await send_all(ws, [f for at in range(0, len(stereo), step) for f in (stereo[at : at + step], finalize)])
        # the server gives up on the stream and logs it, under the request id of the stream's open line
        opened = r"deepgram=(\S+) event=open encoding=pcm_s16le sample_rate=16000 channels=2 multichannel=True"
        await until(lambda: log.search(opened) is not None, HANG_SECONDS)
        match = log.search(opened)
        assert match is not None
        request_id = match.group(1)
        await until(lambda: log.has(f"deepgram={request_id} event=slow_reader"), HANG_SECONDS)
        messages: list[dict[str, Any]] = []
        await read_rest(ws, messages)  # the client reads again: what was buffered, then the server's answer
    return (deepgram_answer(messages, ws),)


# ---------------------------------------------------------------------------------------------------------------------
# The matrix

LISTEN = "/v1/listen"
REALTIME_ROUTE = "/v1/realtime"
TWILIO = "/twilio"
EVENTS = "/v1/calls/{callSid}/events"
PATHS = {
    LISTEN: LISTEN,
    REALTIME_ROUTE: REALTIME,
    TWILIO: TWILIO,
    EVENTS: events_path("CAhostile"),
    DEEPGRAM: f"{DEEPGRAM}{DEEPGRAM_QUERY}",
}


@dataclass(frozen=True)
class Row:
    """One case on one endpoint: what the client does, and the answers docs/protocol.md gives it."""

    case: str
    endpoint: str
    act: Act = field(repr=False)
    expected: tuple[Answer, ...]
    # a server bug this row shows: the row is a strict xfail, and this says what the bug is
    bug: str | None = None

    def param(self) -> Any:
        marks = [pytest.mark.xfail(strict=True, raises=WrongAnswer, reason=self.bug)] if self.bug else []
        return pytest.param(self, id=f"{self.case} on {self.endpoint}", marks=marks)


GOES_ON = Answer()
CLOSED_1000 = Answer(close=1000)
TOO_BIG = Answer(close=1009)  # the WebSocket layer's refusal: no error message (docs/protocol.md, close codes)
READ_ONLY_REFUSAL = Answer(error="bad_message", close=4400, message=READ_ONLY)
TWILIO_MALFORMED = Answer(error="bad_message", close=4400)

ROWS = [
    Row("frame at the size limit", LISTEN, listen_frames_at_the_limit, (CLOSED_1000,)),
    Row(
        "diarized speech frame at the size limit",
        LISTEN,
        listen_diarized_speech_at_the_limit,
        (CLOSED_1000 if speaker_model_installed() else Answer("diarization_unavailable", 4415),),
    ),
    Row("frame at the size limit", REALTIME_ROUTE, realtime_event_at_the_limit, (GOES_ON,)),
    Row("frame at the size limit", TWILIO, twilio_message_at_the_limit, (CLOSED_1000,)),
    Row("frame at the size limit", EVENTS, follower_message_at_the_limit, (READ_ONLY_REFUSAL,)),
    Row("frame at the size limit", DEEPGRAM, deepgram_frames_at_the_limit, (CLOSED_1000,)),
    # /v1/listen and /deepgram/v1/listen have the same limits and say so in the same words, in their own shapes
    *(
        Row(case, endpoint, act, (Answer("frame_too_large", 1009, message),))
        for case, message, acts in (
            (
                "binary frame one byte over",
                f"binary frames may hold at most {MAX_FRAME_BYTES} bytes",
                ((LISTEN, listen_binary_frame_one_byte_over), (DEEPGRAM, deepgram_binary_frame_one_byte_over)),
            ),
            (
                "text frame one byte over",
                f"text frames may hold at most {MAX_TEXT_CHARS} characters",
                ((LISTEN, listen_text_frame_one_byte_over), (DEEPGRAM, deepgram_text_frame_one_byte_over)),
            ),
        )
        for endpoint, act in acts
    ),
    Row(
        "frame one byte over",
        REALTIME_ROUTE,
        realtime_one_byte_over,
        (
            Answer("invalid_json", message=f"events are at most {MAX_EVENT_CHARS} characters"),
            Answer("invalid_value", message=f"one append carries at most 20 s of audio ({MAX_APPEND_BYTES} bytes"),
        ),
    ),
    Row("frame one byte over", TWILIO, twilio_message_one_byte_over, (TWILIO_MALFORMED,)),
    Row("frame one byte over", EVENTS, follower_message_one_byte_over, (TOO_BIG,)),
    Row("10 MB text frame", LISTEN, listen_ten_mb, (TOO_BIG,)),
    Row("10 MB text frame", REALTIME_ROUTE, realtime_ten_mb, (TOO_BIG,)),
    Row("10 MB text frame", TWILIO, twilio_ten_mb, (TOO_BIG,)),
    Row("10 MB text frame", EVENTS, follower_ten_mb, (TOO_BIG,)),
    Row("10 MB text frame", DEEPGRAM, deepgram_ten_mb, (TOO_BIG,)),
    Row(
        "deeply nested JSON",
        LISTEN,
        listen_deep_json,
        (Answer("bad_message", 4400, f"may nest arrays and objects {MAX_DEPTH} deep, this one {LISTEN_DEPTH + 1}"),),
    ),
    Row(
        "deeply nested JSON",
        REALTIME_ROUTE,
        realtime_deep_json,
        (
            Answer(
                "invalid_json", message=f"may nest arrays and objects {MAX_DEPTH} deep, this one {REALTIME_DEPTH + 1}"
            ),
        ),
    ),
    Row("deeply nested JSON", TWILIO, twilio_deep_json, (TWILIO_MALFORMED,)),
    Row("deeply nested JSON", EVENTS, follower_deep_json, (READ_ONLY_REFUSAL,)),
    Row(
        "deeply nested JSON",
        DEEPGRAM,
        deepgram_deep_json,
        (Answer("SchemaError", 1000, f"may nest arrays and objects {MAX_DEPTH} deep, this one {LISTEN_DEPTH + 1}"),),
    ),
    *(
        Row(
            "duplicated headers",
            endpoint,
            duplicated_headers(PATHS[endpoint]),
            tuple(Answer(status=400, message=f"the {name} header may appear once") for name in DUPLICABLE),
        )
        for endpoint in PATHS
    ),
    Row("a flood of tiny frames", LISTEN, listen_tiny_frames, (CLOSED_1000,)),
    Row("a flood of tiny frames", REALTIME_ROUTE, realtime_tiny_frames, (GOES_ON, GOES_ON)),
    Row("a flood of tiny frames", TWILIO, twilio_tiny_frames, (CLOSED_1000, CLOSED_1000)),
    Row("a flood of tiny frames", EVENTS, follower_tiny_frames, (READ_ONLY_REFUSAL,)),
    Row("a flood of tiny frames", DEEPGRAM, deepgram_tiny_frames, (CLOSED_1000,)),
    Row(
        "a huge timestamp jump",
        TWILIO,
        twilio_timestamp_jump,
        (Answer("media_gap_too_long", 4400), CLOSED_1000),
    ),
    Row(
        "an unsupported language",
        LISTEN,
        listen_unsupported_language,
        (Answer("unsupported_audio", 4415, "language 'fr' is not supported"),),
    ),
    Row(
        "an unsupported language",
        REALTIME_ROUTE,
        realtime_unsupported_language,
        (Answer("invalid_value", message="language 'fr' is not supported"),),
    ),
    Row(
        "an unsupported language",
        DEEPGRAM,
        deepgram_unsupported_language,
        (Answer(status=400, message="language 'fr' is not supported"),),
    ),
    *(
        Row("a foreign Origin", endpoint, foreign_origin(PATHS[endpoint]), (Answer(status=403, message="origin"),))
        for endpoint in PATHS
    ),
    Row(
        "another credential's resume",
        LISTEN,
        listen_resume_with_another_key,
        (Answer("unknown_session", 4404, "no session to resume by that id"), CLOSED_1000),
    ),
    Row(
        "a follower flood",
        EVENTS,
        follower_flood,
        (*[Answer("at_capacity", 1013, f"({MAX_FOLLOWERS} followers)")] * FLOOD_EXTRA, CLOSED_1000),
    ),
    Row(
        "a client that stops reading",
        LISTEN,
        listen_stops_reading,
        (Answer("slow_reader", 4408, "the client did not read"),),
    ),
    # nothing is documented for /v1/realtime, and nothing the server says can reach a client that reads nothing
    # until it is let go of: the answer is that the server lets go (realtime_stops_reading waits for it)
    Row("a client that stops reading", REALTIME_ROUTE, realtime_stops_reading, (Answer(close=ENDED),)),
    Row(
        "a client that stops reading",
        EVENTS,
        follower_stops_reading,
        (CLOSED_1000, Answer("slow_reader", 4408)),
    ),
    Row(
        "a client that stops reading",
        DEEPGRAM,
        deepgram_stops_reading,
        (Answer("slow_reader", 4408, "the client did not read"),),
    ),
]


@pytest.mark.parametrize("row", [row.param() for row in ROWS])
async def test_a_hostile_client_gets_its_documented_answer_and_hurts_nobody(
    server: ServerProcess, alone: Transcript, row: Row
) -> None:
    with Watch(server) as watch:
        beside = asyncio.create_task(neighbour(server.port))
        try:
            async with asyncio.timeout(HANG_SECONDS):
                seen = await row.act(server)
                transcript = Transcript.of(await beside)
        finally:
            beside.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await beside
    TALLY["hostile /healthz probes"] += len(watch.latencies)
    TALLY["hostile worst /healthz ms"] = max(TALLY["hostile worst /healthz ms"], round(watch.worst_healthz * 1000))
    TALLY["hostile worst RSS growth MB"] = max(TALLY["hostile worst RSS growth MB"], round(watch.growth_mb, 1))
    # 2. memory, 3. liveness, 4. the neighbour; then 1. the answer (a row's bug shows there)
    assert watch.growth_mb < RSS_GROWTH_MB, f"RSS {watch.before_mb:.1f} MB peaked at {watch.peak_mb:.1f} MB"
    assert not watch.failures, watch.failures[:3]
    assert watch.worst_healthz < HEALTHZ_SANITY_SECONDS, f"/healthz took {watch.worst_healthz:.2f} s"
    assert transcript == alone
    assert_answers(seen, row.expected)
    TALLY["hostile cases"] += 1
    TALLY[f"hostile cases on {row.endpoint}"] += 1
