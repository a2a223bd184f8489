"""A Python client for ``/v1/listen``, for embedding in applications.

Async::

    async with connect("ws://127.0.0.1:8765", sample_rate=16000) as client:
        await client.send_audio(samples)        # bytes in the declared encoding, or a float array in [-1, 1]
        await client.end()                      # no more audio: the server flushes and sends `done`
        async for message in client:            # Ready was consumed by connect(); see client.ready
            if isinstance(message, FinalMessage):
                print(message.text)

Sync (a thread runs the connection): :class:`SyncStreamerClient`, and :func:`transcribe` for a whole array.
Messages are the typed dataclasses of :mod:`streamer.server.client_messages` and :mod:`streamer.server.server_messages`.

A dropped connection does not end the session: the client keeps the audio no final covers yet and 30 s before it,
the context a replica taking the session over re-reads (60 s at most by default), reconnects with a jittered
exponential back-off, resumes the session on whichever server answers, drops the finals it already had and sends the
audio again from where the server says (:mod:`streamer.reconnect` holds the rules; ``docs/operations.md``, "Clients
across failures", the figures). The first connection is asked again the same way while the server says "later"
(HTTP 503 while it loads the model, ``at_capacity``). Iterating drives it: keep a task iterating
while another sends. :class:`~streamer.core.errors.SessionLost` ends the iteration when the session cannot go on.

Latency is what the speaker feels: the client notes when it sent each chunk (:class:`~streamer.reconnect.SendLog`),
so each final's arrival gives its delay from the sending of the audio of its last word, on the client's clock
(:attr:`StreamerClient.final_delays`; :attr:`StreamerClient.summary` at the end, beside the server's share, the
finals' ``latency_ms``).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass
from http import HTTPStatus
from types import TracebackType
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import numpy as np
import numpy.typing as npt
from websockets.asyncio.client import ClientConnection
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus

from streamer.core.audio import Encoding, encode_alaw, encode_mulaw
from streamer.core.container import ContainerEncoding
from streamer.core.errors import MalformedMessage, SessionLost
from streamer.reconnect import AudioRing, Backoff, ReconnectOptions, SendLog, SessionCursor, should_reconnect
from streamer.server.client_messages import Configure, End, Finalize, KeepAlive, serialize_client_message
from streamer.server.listen_query import LISTEN_PATH, ListenParams
from streamer.server.metrics import percentile
from streamer.server.server_messages import (
    Done,
    ErrorMessage,
    FinalMessage,
    Percentiles,
    Ready,
    ServerMessage,
    parse_server_message,
)

__all__ = [
    "FinalDelay",
    "ReconnectOptions",
    "StreamSummary",
    "StreamerClient",
    "SyncStreamerClient",
    "connect",
    "encode_audio",
    "listen_url",
    "transcribe",
]

# wire codes after which no reconnection can help: the client must change its credentials or what it sends
_FINAL_CODES = frozenset({"unauthorized", "unsupported_audio", "bad_message", "frame_too_large", "rate_limited"})


@dataclass(frozen=True)
class FinalDelay:
    """How long one final took, as the speaker felt it and as the server's share of it."""

    seq: int  # the final's, in the client's numbering
    channel: int
    # the speaker-felt delay: from the moment the client sent the audio of the final's last word to the moment the
    # final arrived, on the client's clock
    felt_ms: float
    # the server's share: the final's latency_ms, from the arrival of the audio its text needed to its sending
    server_ms: float


def _percentiles(values: Sequence[float]) -> Percentiles:
    return Percentiles(percentile(values, 50), percentile(values, 95))


@dataclass(frozen=True)
class StreamSummary:
    """A session's figures at its end: the server's ``done`` and the client's own measure of its finals."""

    # the server's summary; None when the session ended without it; after a refused resume, the last server session's
    done: Done | None
    # speaker-felt p50/p95 over the finals with text (FinalDelay.felt_ms); None when there were none
    final_delay_ms: Percentiles
    # the server's share of the same finals (FinalDelay.server_ms)
    server_final_latency_ms: Percentiles
    finals_measured: int  # the finals these percentiles are over

    @classmethod
    def of(cls, done: Done | None, delays: Sequence[FinalDelay]) -> StreamSummary:
        felt = _percentiles([d.felt_ms for d in delays])
        return cls(done, felt, _percentiles([d.server_ms for d in delays]), len(delays))


def listen_url(url: str, params: ListenParams) -> str:
    """``url`` (``ws://host:port`` with or without a path) with the ``/v1/listen`` path and the query of ``params``."""
    parts = urlsplit(url)
    path = parts.path if parts.path not in ("", "/") else LISTEN_PATH
    return urlunsplit((parts.scheme, parts.netloc, path, params.to_query(), ""))


def encode_audio(audio: bytes | npt.NDArray[Any], encoding: Encoding | ContainerEncoding) -> bytes:
    """Bytes pass through; a float array in [-1, 1] (interleaved when stereo) is encoded as ``encoding``. Container
    audio (WebM, Ogg, WAV) is sent as the file's bytes, in chunks of any size."""
    if isinstance(audio, bytes | bytearray | memoryview):
        return bytes(audio)
    if isinstance(encoding, ContainerEncoding):
        raise TypeError(f"encoding={encoding.value} sends a container's bytes, not an array of samples")
    samples = np.asarray(audio, dtype=np.float32).reshape(-1)
    if encoding is Encoding.PCM_S16LE:
        return np.clip(np.round(samples * 32768.0), -32768, 32767).astype("<i2").tobytes()
    if encoding is Encoding.PCM_F32LE:
        return samples.astype("<f4").tobytes()
    if encoding is Encoding.MULAW:
        return encode_mulaw(samples)
    return encode_alaw(samples)


class StreamerClient:
    """One streaming session. Build with :func:`connect`; iterate for server messages until ``done`` or a close.

    Sending and receiving are independent: send from one task while another iterates. With ``reconnect`` (the
    default) the session survives dropped connections as the module docstring says, and the iteration yields each
    new connection's :class:`Ready` (``resumed``, or a new session that continues this one after a refused resume);
    with None, a dropped connection ends the iteration and the next send raises
    :class:`~websockets.exceptions.ConnectionClosed`. ``clock`` (``time.monotonic``) times the speaker-felt delays.
    """

    def __init__(
        self,
        url: str,
        params: ListenParams,
        reconnect: ReconnectOptions | None = None,
        rng: random.Random | None = None,
        api_key: str | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        # the first connection is asked again while the server says "later" (see __aenter__), container or not
        self._first_attempts = reconnect
        if params.container is not None:
            reconnect = None  # a container's bytes cannot be resent from a frame: its session ends with the connection
        self.url = listen_url(url, params)
        # sent on every connection of the session (a resume needs the credentials of the session's owner)
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.params = params
        self.reconnect = reconnect
        self.ready: Ready | None = None  # the latest connection's
        self.done: Done | None = None
        self.errors: list[ErrorMessage] = []
        self.reconnects = 0  # connections made again after a drop
        self.cursor = SessionCursor(params.audio_format)
        self._rng = rng
        self._ring: AudioRing | None = None
        if reconnect is not None:
            reconnect.validate()
            capacity = max(1, round(reconnect.buffer_seconds * params.sample_rate))
            self._ring = AudioRing(capacity, params.audio_format.frame_bytes)
        self._clock = clock
        # when each frame was sent: a container's bytes are not frames, so its finals go unmeasured
        self._sent = SendLog(params.sample_rate) if params.container is None else None
        self.final_delays: list[FinalDelay] = []  # one per final with text, in arrival order
        self._ws: ClientConnection | None = None
        self._live = False  # the current connection is ready and caught up: sends go straight to it
        self._ending = False  # end() was called: say so again on a new connection

    async def __aenter__(self) -> StreamerClient:
        first = await self._first_open()
        if isinstance(first, ErrorMessage):
            raise SessionLost(f"the server refused the session: {first.message}", first.code)
        self._go_live(first)
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    @property
    def ws(self) -> ClientConnection:
        if self._ws is None:
            raise RuntimeError("use 'async with connect(...)' first")
        return self._ws

    @property
    def close_code(self) -> int | None:
        """The close code once the connection is closed (1000 after ``done``)."""
        return self._ws.close_code if self._ws is not None else None

    @property
    def session_id(self) -> str | None:
        return self.cursor.session_id

    @property
    def summary(self) -> StreamSummary:
        """The speaker-felt final delay beside the server's share, with ``done``: read it once the iteration ends."""
        return StreamSummary.of(self.done, self.final_delays)

    async def send_audio(self, audio: bytes | npt.NDArray[Any]) -> None:
        """Send audio in the declared format: raw bytes (whole frames), or float samples in [-1, 1] to be encoded.
        While the client reconnects, the audio waits in the ring and goes out once the session is resumed."""
        data = encode_audio(audio, self.params.encoding)
        if self._sent is not None:
            self._sent.record(len(data) // self.params.audio_format.frame_bytes, self._clock())
        if self._ring is not None:
            self._ring.append(data)
        if self._live:
            await self._send(data)

    async def finalize(self) -> None:
        """Ask the server to commit what it has heard so far as finals (not repeated on a later connection)."""
        if self._live:
            await self._send(serialize_client_message(Finalize()))

    async def keepalive(self) -> None:
        if self._live:
            await self._send(serialize_client_message(KeepAlive()))

    async def configure(self, *, prompt: str | None = None, keywords: Sequence[str] | None = None) -> None:
        """Change the session's prompt and keywords from the next window on; None leaves one as it is."""
        message = Configure(prompt=prompt, keywords=None if keywords is None else tuple(keywords))
        if self._live:  # a resumed session keeps what it was configured with
            await self._send(serialize_client_message(message))

    async def end(self) -> None:
        """No more audio; keep iterating to receive the last finals and ``done``."""
        self._ending = True
        if self._live:
            await self._send(serialize_client_message(End()))

    async def close(self) -> None:
        self._live = False
        self._ending = True
        if self._ws is not None:
            await self._ws.close()

    async def _send(self, data: bytes | str) -> None:
        try:
            await self.ws.send(data)
        except ConnectionClosed:
            if self.reconnect is None:
                raise
            self._live = False  # the iterator reconnects; the ring has the audio

    def __aiter__(self) -> AsyncIterator[ServerMessage]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[ServerMessage]:
        while self.done is None:
            try:
                raw = await self.ws.recv(decode=True)
            except ConnectionClosed:
                if self.reconnect is None or not should_reconnect(self.close_code):
                    return
                self._live = False
                await self._reconnect(self.reconnect)
                assert self.ready is not None
                yield self.ready  # the caller learns of the new connection: resumed, or a new session
                continue
            message = self.cursor.receive(parse_server_message(raw))
            if message is None:
                continue  # a final received on an earlier connection, replayed on this one
            if isinstance(message, ErrorMessage):
                self.errors.append(message)
            elif isinstance(message, Done):
                self.done = message
            elif isinstance(message, FinalMessage):
                self._measure(message, self._clock())
                if self._ring is not None:
                    self._ring.release(self.cursor.release_point())
            yield message
        with contextlib.suppress(ConnectionClosed):  # the close that follows done
            await self.ws.recv()

    def _measure(self, final: FinalMessage, now: float) -> None:
        """A final arrived at ``now`` (in the client's timeline): note its speaker-felt delay, from the sending of
        its last word's end (the final's end when it carries no words), and forget what no later final needs."""
        if self._sent is None:
            return
        sent = self._sent.sent_at(final.words[-1].end if final.words else final.end)
        if sent is not None and final.text.strip():
            self.final_delays.append(FinalDelay(final.seq, final.channel, 1000 * (now - sent), final.latency_ms))
        self._sent.prune(self.cursor.committed_point())

    async def _first_open(self) -> Ready | ErrorMessage:
        """The session's first connection. With reconnection on, a server that says "later" is asked again within
        the reconnection back-off's bounds: HTTP 503 (it is loading the model, or a load balancer has no ready
        replica yet) or ``at_capacity``. Anything else is the answer at once, and so is
        the last "later" past the bounds (the refusal raised, or the error returned)."""
        options = self._first_attempts
        backoff = Backoff(options, self._rng) if options is not None else None
        loop = asyncio.get_running_loop()
        while True:
            later: InvalidStatus | ErrorMessage
            try:
                answer = await self._open("")
            except InvalidStatus as refusal:
                if backoff is None or refusal.response.status_code != HTTPStatus.SERVICE_UNAVAILABLE:
                    raise
                later = refusal
            else:
                if backoff is None or not (isinstance(answer, ErrorMessage) and answer.code == "at_capacity"):
                    return answer
                later = answer
            delay = backoff.next_delay(loop.time())
            if delay is None:
                if isinstance(later, ErrorMessage):
                    return later
                raise later
            await asyncio.sleep(delay)

    async def _open(self, resume_query: str) -> Ready | ErrorMessage:
        """Connect (with ``resume_query`` to resume) and read the first message: ``ready``, or the error the server
        closes with. Raises OSError, InvalidHandshake, TimeoutError or ConnectionClosed when no answer came."""
        url = self.url if not resume_query else f"{self.url}&{resume_query}"
        # the client trusts the server: buffer all its messages rather than stall it while the caller sends
        ws = await ws_connect(url, max_queue=None, compression=None, additional_headers=self._headers)
        try:
            first = parse_server_message(await ws.recv(decode=True))
        except BaseException:
            await ws.close()
            raise
        self._ws = ws
        if isinstance(first, ErrorMessage):
            await ws.close()
            return first
        if not isinstance(first, Ready):
            await ws.close()
            raise MalformedMessage(f"expected 'ready' from the server, got {first!r}")
        return first

    def _go_live(self, ready: Ready) -> None:
        self.ready = ready
        self.cursor.ready(ready)
        self._live = True

    async def _reconnect(self, options: ReconnectOptions) -> None:
        """The connection dropped mid-session: reconnect, resume (or start again after the last final), send the
        audio the server lacks, and go live; raise :class:`SessionLost` past the back-off's bounds."""
        assert self._ring is not None
        backoff = Backoff(options, self._rng)
        loop = asyncio.get_running_loop()
        last_problem = "the connection dropped"
        while True:
            delay = backoff.next_delay(loop.time())
            if delay is None:
                raise SessionLost(f"gave up after {backoff.attempts} attempts to reconnect: {last_problem}")
            await asyncio.sleep(delay)
            try:
                answer = await self._open(self.cursor.resume_query(self._ring.start))
            except (OSError, InvalidHandshake, TimeoutError, ConnectionClosed) as error:
                last_problem = f"{type(error).__name__}: {error}"
                continue
            if isinstance(answer, ErrorMessage):
                last_problem = f"{answer.code}: {answer.message}"
                if answer.code in _FINAL_CODES:
                    raise SessionLost(f"the server refused the session: {answer.message}", answer.code)
                if answer.code == "unknown_session":
                    self.cursor.restart()  # gone everywhere: a new session from the end of the last final
                    backoff.attempts -= 1  # and at once: this was an answer, not a failure
                continue
            start = self.cursor.resume_frame(answer) if answer.resumed else self.cursor.frame_base
            try:
                await self._catch_up(start)
            except ConnectionClosed as error:
                last_problem = f"dropped again while sending the buffered audio: {error}"
                continue
            self.reconnects += 1
            self._go_live(answer)
            if self._ending:
                await self._send(serialize_client_message(End()))
            return

    async def _catch_up(self, start: int) -> None:
        """Send the audio from frame ``start`` (silence for what the ring no longer holds, reported lost), then
        whatever the caller sent meanwhile, until the connection has all of it."""
        assert self._ring is not None
        sent = start
        while True:
            replay = self._ring.replay(sent)
            self.cursor.note_replay(replay)
            sent = self._ring.end  # the replay holds everything up to here
            if replay.silence:
                silence = np.zeros(replay.silence * self.params.channels, dtype=np.float32)
                await self.ws.send(encode_audio(silence, self.params.encoding))
            if replay.data:
                await self.ws.send(replay.data)
            if self._ring.end == sent:  # nothing more came while it went out
                return


def connect(
    url: str,
    *,
    sample_rate: int = 16000,
    encoding: Encoding | ContainerEncoding | str = Encoding.PCM_S16LE,
    channels: int = 1,
    language: str | None = None,
    prompt: str = "",
    keywords: Sequence[str] = (),
    reconnect: ReconnectOptions | None = ReconnectOptions(),  # noqa: B008 (frozen: one shared default is fine)
    rng: random.Random | None = None,
    api_key: str | None = None,
    clock: Callable[[], float] = time.monotonic,
    diarize: bool = False,
    max_speakers: int | None = None,
) -> StreamerClient:
    """A client for ``url`` (``ws://host:port``); use as ``async with connect(...) as client``. ``prompt`` and
    ``keywords`` bias decoding towards a domain and its spellings (docs/protocol.md). ``reconnect``:
    how a dropped connection is resumed (None: it ends the session); ``rng`` draws the back-off's jitter;
    ``api_key`` goes in the ``Authorization`` header of every connection (servers with ``--api-key``); ``clock``
    times the speaker-felt delays (:attr:`StreamerClient.summary`); ``diarize`` asks for a speaker on every final
    and word (at most ``max_speakers`` of them).
    ``encoding`` may name a container (``opus``, ``container``): then send the file's bytes, and ``sample_rate`` is
    not used; such a stream is not resumed (its bytes cannot be cut at a frame the server names)."""
    kind = ContainerEncoding(encoding) if encoding in set(ContainerEncoding) else Encoding(encoding)
    params = ListenParams(sample_rate, kind, channels, language, prompt, tuple(keywords), diarize, max_speakers)
    return StreamerClient(url, params, reconnect, rng, api_key, clock)


class SyncStreamerClient:
    """Blocking wrapper: a private event loop thread runs a :class:`StreamerClient`.

    ::

        with SyncStreamerClient("ws://127.0.0.1:8765") as client:
            client.send_audio(samples)
            client.end()
            for message in client:
                ...
    """

    def __init__(self, url: str, **kwargs: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="streamer-client", daemon=True)
        self._client = connect(url, **kwargs)
        self._iterator: AsyncIterator[ServerMessage] | None = None

    def _call(self, coroutine: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    def __enter__(self) -> SyncStreamerClient:
        self._thread.start()
        self._call(self._client.__aenter__())
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            self._call(self._client.close())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
            self._loop.close()

    @property
    def ready(self) -> Ready | None:
        return self._client.ready

    @property
    def done(self) -> Done | None:
        return self._client.done

    @property
    def final_delays(self) -> list[FinalDelay]:
        return self._client.final_delays

    @property
    def summary(self) -> StreamSummary:
        return self._client.summary

    def send_audio(self, audio: bytes | npt.NDArray[Any]) -> None:
        self._call(self._client.send_audio(audio))

    def finalize(self) -> None:
        self._call(self._client.finalize())

    def end(self) -> None:
        self._call(self._client.end())

    def keepalive(self) -> None:
        self._call(self._client.keepalive())

    def configure(self, *, prompt: str | None = None, keywords: Sequence[str] | None = None) -> None:
        self._call(self._client.configure(prompt=prompt, keywords=keywords))

    def close(self) -> None:
        """Close the connection now (leaving the ``with`` block does it too)."""
        self._call(self._client.close())

    def __iter__(self) -> Iterator[ServerMessage]:
        iterator = self._client.__aiter__()
        while True:
            try:
                yield self._call(iterator.__anext__())
            except StopAsyncIteration:
                return


def transcribe(url: str, audio: npt.NDArray[Any], *, sample_rate: int = 16000, chunk_seconds: float = 0.1) -> str:
    """Stream a whole mono float array as fast as the server takes it and return the final text."""
    step = max(1, int(chunk_seconds * sample_rate))
    with SyncStreamerClient(url, sample_rate=sample_rate) as client:
        for start in range(0, len(audio), step):
            client.send_audio(audio[start : start + step])
        client.end()
        texts = [m.text.strip() for m in client if isinstance(m, FinalMessage)]
    return " ".join(t for t in texts if t)
