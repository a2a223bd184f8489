"""The ``streamer stream`` command: stream a file (or the microphone) to a server and show the live transcript.

On a terminal, the current partial is shown dim and rewritten in place (ANSI), and each final is committed on its
own line; elsewhere only finals are printed. ``--json`` prints every server message as one JSON line instead. At
the end come the transcript, the ``done`` message's figures and the final delay the speaker felt (from the sending of
the audio of a final's last word to its arrival, on this client's clock) beside the server's share of it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TextIO

import numpy as np
import numpy.typing as npt

from streamer.core.errors import ConfigError, SessionLost
from streamer.core.units import SAMPLE_RATE
from streamer.reconnect import ReconnectOptions
from streamer.server.server_messages import (
    Done,
    ErrorMessage,
    FinalMessage,
    LostRange,
    PartialMessage,
    Ready,
    ServerMessage,
    serialize,
)

if TYPE_CHECKING:
    from streamer.client import StreamSummary

__all__ = ["LiveView", "configure_parser", "paced_chunks", "run"]

DIM = "\x1b[2m"
RESET = "\x1b[0m"
CLEAR_LINE = "\r\x1b[K"
MIC_HINT = "--mic needs the sounddevice package: pip install 'streamer[mic]'"


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", nargs="?", help="audio file to stream (any format streamer transcribe reads)")
    parser.add_argument("--url", default="ws://127.0.0.1:8765", help="server address (default: %(default)s)")
    parser.add_argument(
        "--speed", type=float, default=1.0, help="pace relative to real time; 0 sends as fast as possible (default: 1)"
    )
    parser.add_argument("--json", action="store_true", help="print every server message as a JSON line")
    parser.add_argument("--mic", action="store_true", help="stream the default microphone until Ctrl-C")
    parser.add_argument("--chunk-ms", type=int, default=100, help="audio per binary frame (default: %(default)s)")
    parser.add_argument("--language", default=None, help="ISO 639-1 language code (multilingual models)")
    parser.add_argument(
        "--buffer-seconds",
        type=float,
        default=ReconnectOptions.buffer_seconds,
        help="audio kept to resend after a dropped connection, from 30 s before the last final (default: %(default)s)",
    )
    parser.add_argument(
        "--no-reconnect", action="store_true", help="end the stream when the connection drops instead of resuming"
    )


@dataclass
class LiveView:
    """Renders server messages to ``out``; collects the final text per channel and the ``done`` summary."""

    out: TextIO
    json_lines: bool = False
    tty: bool = False
    finals: list[FinalMessage] = field(default_factory=list)
    errors: list[ErrorMessage] = field(default_factory=list)
    done: Done | None = None
    reconnects: int = 0
    # audio a resume asked for that the client's buffer no longer held (sent as silence)
    lost: list[LostRange] = field(default_factory=list)
    # the client's measure at the end: the speaker-felt final delay beside the server's share
    measured: StreamSummary | None = None
    _readies: int = 0
    _partial_shown: bool = False

    def show(self, message: ServerMessage) -> None:
        if isinstance(message, Ready):
            self._readies += 1
            self.reconnects = self._readies - 1
        if isinstance(message, FinalMessage):
            self.finals.append(message)
        elif isinstance(message, ErrorMessage):
            self.errors.append(message)
        elif isinstance(message, Done):
            self.done = message
        if self.json_lines:
            print(serialize(message), file=self.out, flush=True)
            return
        if isinstance(message, PartialMessage) and self.tty:
            self.out.write(f"{CLEAR_LINE}{DIM}{self._label(message)}{message.text.strip()}{RESET}")
            self._partial_shown = True
        elif isinstance(message, FinalMessage) and message.text.strip():
            self._clear_partial()
            self.out.write(f"{self._label(message)}{message.text.strip()}\n")
        elif isinstance(message, ErrorMessage):
            self._clear_partial()
            lost = f" (lost {message.lost.start:.2f}-{message.lost.end:.2f} s)" if message.lost else ""
            self.out.write(f"[error {message.code}: {message.message}{lost}]\n")
        elif isinstance(message, Ready) and self.reconnects:
            self._clear_partial()
            how = "resumed" if message.resumed else "continued as a new session from the last final"
            self.out.write(f"[reconnected: {how}, session {message.session_id}]\n")
        self.out.flush()

    def _clear_partial(self) -> None:
        if self._partial_shown:
            self.out.write(CLEAR_LINE)
            self._partial_shown = False

    @staticmethod
    def _label(message: PartialMessage | FinalMessage) -> str:
        return f"[ch{message.channel}] " if message.channel else ""

    def summary(self) -> str:
        """The transcript and the latency figures, for the end of the run."""
        text = " ".join(m.text.strip() for m in sorted(self.finals, key=lambda m: m.start) if m.text.strip())
        lines = ["", "transcript:", text or "(no speech)"]
        if self.done is not None:
            d = self.done
            lines.append(
                f"audio {d.audio_seconds_received:.2f} s: transcribed {d.audio_seconds_transcribed:.2f} s, "
                f"non-speech {d.non_speech_seconds:.2f} s, lost {d.lost_seconds:.2f} s"
            )
            p = d.latency.partial
            if p.p50 is not None and p.p95 is not None:
                lines.append(f"partial latency (server's share): p50 {p.p50:.0f} ms, p95 {p.p95:.0f} ms")
        lines += self._final_delay_lines()
        if self.reconnects:
            # after a refused resume, done covers only the new session: the client's own figures say the rest
            lost = sum(r.end - r.start for r in self.lost)
            ranges = "".join(f" {r.start:.2f}-{r.end:.2f} s" for r in self.lost)
            lines.append(f"reconnected {self.reconnects} times; lost by the client's buffer {lost:.2f} s{ranges}")
        return "\n".join(lines)

    def _final_delay_lines(self) -> list[str]:
        """The speaker-felt final delay beside the server's share; the server's share alone (labelled so) when the
        client measured no final."""
        m = self.measured
        if m is not None and m.finals_measured:
            felt, share = m.final_delay_ms, m.server_final_latency_ms
            return [
                f"final delay (speaker-felt): p50 {felt.p50:.0f} ms, p95 {felt.p95:.0f} ms; "
                f"server's share: p50 {share.p50:.0f} ms, p95 {share.p95:.0f} ms"
            ]
        f = self.done.latency.final if self.done is not None else None
        if f is not None and f.p50 is not None and f.p95 is not None:
            return [f"final latency (server's share): p50 {f.p50:.0f} ms, p95 {f.p95:.0f} ms"]
        return []


async def paced_chunks(
    samples: npt.NDArray[np.float32],
    chunk: int,
    speed: float,
    *,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> AsyncIterator[npt.NDArray[np.float32]]:
    """Yield ``chunk``-sample slices, each no earlier than its real-time moment divided by ``speed`` (0: at once).

    Each slice is due at its place in the audio from the first one, not from the previous one: a consumer that was
    late gets the next slices at once, and the schedule does not drift. ``clock`` and ``sleep`` are
    ``time.monotonic`` and ``asyncio.sleep``; tests pass a fake clock."""
    started = clock()
    for index, start in enumerate(range(0, len(samples), chunk)):
        if speed > 0:
            due = started + index * chunk / SAMPLE_RATE / speed
            await sleep(max(0.0, due - clock()))
        yield samples[start : start + chunk]


async def _microphone(chunk: int) -> AsyncIterator[npt.NDArray[np.float32]]:
    try:
        import sounddevice
    except ImportError:
        raise ConfigError(MIC_HINT) from None
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[npt.NDArray[np.float32]] = asyncio.Queue()

    def callback(indata: npt.NDArray[np.float32], frames: int, when: Any, status: Any) -> None:
        loop.call_soon_threadsafe(queue.put_nowait, indata[:, 0].copy())

    with sounddevice.InputStream(
        samplerate=SAMPLE_RATE, channels=1, dtype="float32", blocksize=chunk, callback=callback
    ):
        print("streamer: listening to the microphone; Ctrl-C to stop", file=sys.stderr)
        while True:
            yield await queue.get()


async def stream(
    url: str,
    source: AsyncIterator[npt.NDArray[np.float32]],
    view: LiveView,
    language: str | None = None,
    reconnect: ReconnectOptions | None = None,
) -> int:
    """Send ``source`` to ``url`` while showing what comes back; return the exit code (0 after ``done``). With
    ``reconnect`` a dropped connection is resumed (:mod:`streamer.reconnect`)."""
    from streamer.client import connect

    async with connect(url, sample_rate=SAMPLE_RATE, language=language, reconnect=reconnect) as client:
        assert client.ready is not None
        view.show(client.ready)

        async def send() -> None:
            try:
                async for samples in source:
                    await client.send_audio(samples)
            finally:
                with contextlib.suppress(Exception):
                    await client.end()

        sender = asyncio.create_task(send())
        with contextlib.suppress(NotImplementedError, RuntimeError):  # no signals off the main thread or on Windows
            # Ctrl-C stops the audio, not the program: the server still flushes the finals and says done
            asyncio.get_running_loop().add_signal_handler(signal.SIGINT, sender.cancel)
        try:
            async for message in client:
                view.show(message)
        except SessionLost as error:
            print(f"streamer: error: the session is lost: {error}", file=sys.stderr)
        finally:
            view.lost = list(client.cursor.lost)
            view.measured = client.summary
            sender.cancel()
            with contextlib.suppress(asyncio.CancelledError, KeyboardInterrupt):
                await sender
        return 0 if view.done is not None else 5


def run(args: argparse.Namespace) -> int:
    if args.mic == bool(args.file):
        raise ConfigError("give an audio FILE or --mic (one of the two)")
    if args.speed < 0:
        raise ConfigError("--speed must be >= 0")
    chunk = max(1, args.chunk_ms * SAMPLE_RATE // 1000)
    if args.mic:
        try:
            import sounddevice  # noqa: F401
        except ImportError:
            raise ConfigError(MIC_HINT) from None
        source = _microphone(chunk)
    else:
        from streamer.offline.audiofile import load_audio

        source = paced_chunks(load_audio(args.file).samples, chunk, args.speed)
    reconnect = None if args.no_reconnect else ReconnectOptions(buffer_seconds=args.buffer_seconds)
    if reconnect is not None:
        reconnect.validate()
    from websockets.exceptions import InvalidHandshake, InvalidStatus

    view = LiveView(out=sys.stdout, json_lines=args.json, tty=sys.stdout.isatty())
    try:
        code = asyncio.run(stream(args.url, source, view, args.language, reconnect))
    except OSError as error:
        print(f"streamer: error: cannot reach {args.url}: {error}", file=sys.stderr)
        return 5
    except InvalidStatus as refusal:  # refused before the session began (a 503 only once the retries ran out)
        response = refusal.response
        why = response.body.decode("utf-8", "replace").strip() if response.body else response.reason_phrase
        print(f"streamer: error: {args.url} refused the session: HTTP {response.status_code} ({why})", file=sys.stderr)
        return 5
    except InvalidHandshake as error:
        print(f"streamer: error: {args.url} did not open a WebSocket: {error}", file=sys.stderr)
        return 5
    if not args.json:
        print(view.summary())
    return code
