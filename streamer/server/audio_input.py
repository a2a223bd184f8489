"""The one frame intake of the endpoints that take binary audio frames (``/v1/listen`` and ``/deepgram/v1/listen``):
the frame size limit, the stream's audio rate limit, then raw samples (:class:`RawInput`) or a file's bytes
(:class:`~streamer.server.container_input.ContainerInput`), shaped into the stream's transcripts and handed to the
adapter's sink at the source rate. Sans-I/O like the adapters.

One per stream, made when the stream opens (:func:`open_audio_input`)::

    audio = open_audio_input(raw_format, params.container, transcripts, rate_limit, limiter, sink)
    check_frame_size(frame, max_frame_bytes)     # per binary frame, then:
    audio.receive(frame, now)                    # sink(samples, now) gets what it completed
    error = audio.end(now)                       # no more frames: the last samples, and a container cut short
    audio.restart(now)                           # (resume) a new connection: a cut frame or file is not audio
"""

from __future__ import annotations

from typing import Protocol

from streamer.core.audio import AudioFormat, WireDecoder, downmix
from streamer.core.container import ContainerEncoding, Samples
from streamer.core.errors import FrameTooLarge, InvalidState, ProtocolError
from streamer.server.container_input import ContainerInput, SamplesSink
from streamer.server.ratelimit import AudioRateLimiter, RateLimitOptions

__all__ = ["AudioInput", "RawInput", "check_frame_size", "open_audio_input"]


class AudioInput(Protocol):
    """What an adapter asks of its stream's audio, raw or containerised."""

    @property
    def seconds(self) -> float:
        """Seconds (per channel) received and handed to the sink, over every connection of the stream."""
        ...

    @property
    def channels(self) -> int | None:
        """The audio's channels (a container's, once its header is in)."""
        ...

    def receive(self, frame: bytes, now: float) -> None:
        """A binary frame (within the size limit: :func:`check_frame_size`); raises the stream's fault after what
        came before it reached the sink."""
        ...

    def end(self, now: float) -> ProtocolError | None:
        """No more frames: the last samples, then the error if the audio was cut short."""
        ...

    def restart(self, now: float) -> None:
        """A resumed stream's new connection: what the old one cut off (half a frame, a file's end) is not audio."""
        ...

    def start_at(self, seconds: float) -> None:
        """A stream taken over from another process: its client resends from ``seconds`` into the stream."""
        ...


def check_frame_size(frame: bytes, max_frame_bytes: int) -> None:
    """Raise :class:`~streamer.core.errors.FrameTooLarge` for a binary frame over the stream's limit."""
    if len(frame) > max_frame_bytes:
        raise FrameTooLarge(f"binary frames may hold at most {max_frame_bytes} bytes, this one had {len(frame)}")


class RawInput:
    """Raw samples in the stream's wire format (:class:`~streamer.core.audio.WireDecoder`). Each frame is charged to
    the rate limit by its whole frames before it is decoded (a flood costs neither decoding nor engine time); the
    channels are mixed down for one transcript, else one row each."""

    def __init__(self, fmt: AudioFormat, transcripts: int, limiter: AudioRateLimiter, sink: SamplesSink) -> None:
        self.format = fmt
        self.transcripts = transcripts
        self._limiter = limiter
        self._sink = sink
        self._decoder = WireDecoder(fmt)
        # frames (one sample per channel, at the client's rate) received: where a resuming client goes on from
        self.frames = 0

    @property
    def seconds(self) -> float:
        return self.frames / self.format.sample_rate

    @property
    def channels(self) -> int:
        return self.format.channels

    def receive(self, frame: bytes, now: float) -> None:
        self._limiter.receive(len(frame) // self.format.frame_bytes, self.format.sample_rate, now)
        per_channel = self._decoder.decode(frame)
        self.frames += per_channel.shape[1]
        if self.transcripts == 1 and len(per_channel) > 1:
            per_channel = downmix(per_channel)[None, :]
        self._sink(Samples(per_channel, self.format.sample_rate), now)

    def end(self, now: float) -> ProtocolError | None:
        self._decoder.flush()  # an incomplete trailing frame is not audio; nothing to account
        return None

    def restart(self, now: float) -> None:
        self._decoder.flush()  # a sample cut in half by the drop is not audio; the client resends from a frame

    def start_at(self, seconds: float) -> None:
        self.frames = round(seconds * self.format.sample_rate)


def open_audio_input(
    fmt: AudioFormat | None,
    container: ContainerEncoding | None,
    transcripts: int | None,
    rate_limit: RateLimitOptions,
    limiter: AudioRateLimiter,
    sink: SamplesSink,
) -> RawInput | ContainerInput:
    """The stream's input: a file of ``container``, else raw samples of ``fmt``. ``transcripts``: 1 mixes the
    channels down, n asks for n channels, None (containers only) takes as many as the file has."""
    if container is not None:
        return ContainerInput(container, transcripts, rate_limit, limiter, sink)
    if fmt is None:
        raise InvalidState("raw audio needs its format")
    return RawInput(fmt, fmt.channels if transcripts is None else transcripts, limiter, sink)
