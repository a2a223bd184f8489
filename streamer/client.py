"""A Python client for ``/v1/listen``, for embedding in applications.

Async::

    async with connect("ws://127.0.0.1:8765", sample_rate=16000) as client:
        await client.send_audio(samples)        # bytes in the declared encoding, or a float array in [-1, 1]
        await client.end()                      # no more audio: the server flushes and sends `done`
        async for message in client:            # Ready was consumed by connect(); see client.ready
            if isinstance(message, FinalMessage):
                print(message.text)

Sync (a thread runs the connection): :class:`SyncStreamerClient`, and :func:`transcribe` for a whole array.
Messages are the typed dataclasses of :mod:`streamer.server.protocol`.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Iterator, Sequence
from types import TracebackType
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import numpy as np
import numpy.typing as npt
from websockets.asyncio.client import ClientConnection
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed

from streamer.core.audio import Encoding, encode_alaw, encode_mulaw
from streamer.core.errors import MalformedMessage
from streamer.server.protocol import (
    LISTEN_PATH,
    Configure,
    Done,
    End,
    ErrorMessage,
    Finalize,
    FinalMessage,
    KeepAlive,
    ListenParams,
    Ready,
    ServerMessage,
    parse_server_message,
    serialize_client_message,
)

__all__ = ["StreamerClient", "SyncStreamerClient", "connect", "encode_audio", "listen_url", "transcribe"]


def listen_url(url: str, params: ListenParams) -> str:
    """``url`` (``ws://host:port`` with or without a path) with the ``/v1/listen`` path and the query of ``params``."""
    parts = urlsplit(url)
    path = parts.path if parts.path not in ("", "/") else LISTEN_PATH
    return urlunsplit((parts.scheme, parts.netloc, path, params.to_query(), ""))


def encode_audio(audio: bytes | npt.NDArray[Any], encoding: Encoding) -> bytes:
    """Bytes pass through; a float array in [-1, 1] (interleaved when stereo) is encoded as ``encoding``."""
    if isinstance(audio, bytes | bytearray | memoryview):
        return bytes(audio)
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

    Sending and receiving are independent: send from one task while another iterates.
    """

    def __init__(self, url: str, params: ListenParams) -> None:
        self.url = listen_url(url, params)
        self.params = params
        self.ready: Ready | None = None
        self.done: Done | None = None
        self.errors: list[ErrorMessage] = []
        self._ws: ClientConnection | None = None

    async def __aenter__(self) -> StreamerClient:
        # the client trusts the server: buffer all its messages rather than stall it while the caller sends
        self._ws = await ws_connect(self.url, max_queue=None, compression=None)
        first = await self._next()
        if not isinstance(first, Ready):
            await self._ws.close()
            raise MalformedMessage(f"expected 'ready' from the server, got {first!r}")
        self.ready = first
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

    async def send_audio(self, audio: bytes | npt.NDArray[Any]) -> None:
        """Send audio in the declared format: raw bytes, or float samples in [-1, 1] to be encoded."""
        await self.ws.send(encode_audio(audio, self.params.encoding))

    async def finalize(self) -> None:
        """Ask the server to commit what it has heard so far as finals."""
        await self.ws.send(serialize_client_message(Finalize()))

    async def keepalive(self) -> None:
        await self.ws.send(serialize_client_message(KeepAlive()))

    async def configure(self, *, prompt: str | None = None, keywords: Sequence[str] | None = None) -> None:
        """Change the session's prompt and keywords from the next window on; None leaves one as it is."""
        message = Configure(prompt=prompt, keywords=None if keywords is None else tuple(keywords))
        await self.ws.send(serialize_client_message(message))

    async def end(self) -> None:
        """No more audio; keep iterating to receive the last finals and ``done``."""
        await self.ws.send(serialize_client_message(End()))

    async def close(self) -> None:
        if self._ws is not None:
            await self._ws.close()

    async def _next(self) -> ServerMessage:
        message = parse_server_message(await self.ws.recv(decode=True))
        if isinstance(message, ErrorMessage):
            self.errors.append(message)
        elif isinstance(message, Done):
            self.done = message
        return message

    def __aiter__(self) -> AsyncIterator[ServerMessage]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[ServerMessage]:
        while True:
            try:
                yield await self._next()
            except ConnectionClosed:
                return


def connect(
    url: str,
    *,
    sample_rate: int = 16000,
    encoding: Encoding | str = Encoding.PCM_S16LE,
    channels: int = 1,
    language: str | None = None,
    prompt: str = "",
    keywords: Sequence[str] = (),
) -> StreamerClient:
    """A client for ``url`` (``ws://host:port``); use as ``async with connect(...) as client``. ``prompt`` and
    ``keywords`` bias decoding towards a domain and its spellings (docs/protocol.md)."""
    params = ListenParams(sample_rate, Encoding(encoding), channels, language, prompt, tuple(keywords))
    return StreamerClient(url, params)


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
