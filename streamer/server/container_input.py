"""Containerised audio on a stream endpoint (``/v1/listen?encoding=opus|container``, ``/deepgram/v1/listen`` without
``encoding``): the binary frames are a file's bytes, decoded by
:class:`~streamer.core.container.ContainerDecoder` as they arrive, charged to the stream's audio rate limit by what
they decode to, shaped into the stream's transcripts and handed to the adapter. Sans-I/O like the adapters.

One per stream, made when the stream opens::

    feed = ContainerInput(ContainerEncoding.OPUS, transcripts=1, rate_limit, limiter, sink)
    feed.receive(frame, now)    # per binary frame; sink(samples, now) gets what it completed, shaped
    ...                         # on a ProtocolError: what came before the fault reached sink; end the stream with it
    error = feed.end(now)       # no more frames: the last samples, and BadContainer if the file was cut short
    feed.restart(now)           # (resume) the next connection sends a new file: keep what the old one completed

The sink gets :class:`~streamer.core.container.Samples` of ``(transcripts, frames)`` at the container's rate: the
channels mixed down for one transcript, or one row per channel (``transcripts=None``: as many as the container
has). It resamples to the model's rate itself (the container's rate is known only once its header is in, and a
restarted file may have another).

Accounting (issue 17): a fault loses nothing decoded before it. The decoder keeps the packets before a corrupt one;
:meth:`ContainerInput.receive` hands them to the sink before it raises, and :meth:`ContainerInput.end` hands over
what the codec still held before it reports a file cut short.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

from streamer.core.audio import downmix
from streamer.core.container import ContainerDecoder, ContainerEncoding, ContainerOptions, Samples
from streamer.core.errors import ProtocolError, UnsupportedAudio
from streamer.server.ratelimit import AudioRateLimiter, RateLimitOptions

__all__ = ["ContainerInput", "SamplesSink"]

SamplesSink = Callable[[Samples, float], None]
"""Called with each run of decoded audio, shaped into the stream's transcripts, and the ``now`` of its frame."""


class ContainerInput:
    """One stream's containerised audio; see the module docstring. ``limiter`` is the stream's own audio rate limit
    (the raw-audio path of the same adapter charges it too), ``rate_limit`` its options."""

    def __init__(
        self,
        encoding: ContainerEncoding,
        transcripts: int | None,
        rate_limit: RateLimitOptions,
        limiter: AudioRateLimiter,
        sink: SamplesSink,
    ) -> None:
        self.encoding = encoding
        # 1: mixed down; n: the container must hold n channels; None: one transcript per channel it holds
        self.transcripts = transcripts
        self._rate_limit = rate_limit
        self._limiter = limiter
        self._sink = sink
        self.decoder = self._new_decoder()
        # seconds (per channel) decoded and handed to the sink, over every file of the stream
        self.seconds = 0.0

    def _new_decoder(self) -> ContainerDecoder:
        # a call may decode as much audio as the client may send at once: beyond, the rate limit would refuse it
        most = self._rate_limit.burst_seconds if self._rate_limit.enabled else ContainerOptions.max_seconds_per_receive
        return ContainerDecoder(ContainerOptions(codec=self.encoding.codec, max_seconds_per_receive=most))

    @property
    def channels(self) -> int | None:
        """The container's channels, once its header is in."""
        return self.decoder.channels

    def receive(self, frame: bytes, now: float) -> None:
        """A binary frame. Its size says nothing of its duration, so the rate limit is charged with what it decoded
        to (at most ``max_seconds_per_receive``) before any of it reaches the sink.

        Raises the :class:`~streamer.core.errors.ProtocolError` of a fault (``bad_container``,
        ``unsupported_audio``, ``frame_too_large``, ``rate_limited``) after the audio before it reached the sink; the
        caller ends the stream with it (:meth:`end` then adds nothing)."""
        try:
            samples = self.decoder.receive(frame)
        except ProtocolError:
            # the packets before the fault are audio the client sent in good order: transcribed, then the error
            with contextlib.suppress(ProtocolError):
                self._deliver(self.decoder.flush(), now)
            raise
        if samples.frames:
            self._limiter.receive(samples.frames, samples.sample_rate, now)
        self._deliver(samples, now)

    def end(self, now: float) -> ProtocolError | None:
        """No more frames: the last samples to the sink, then the error if the file was cut short (None if not, or
        if :meth:`receive` already raised the stream's fault)."""
        try:
            self._deliver(self.decoder.flush(), now)
            self.decoder.check_complete()
        except ProtocolError as error:
            return error
        return None

    def restart(self, now: float) -> None:
        """A new connection of a resumed stream starts a new file (a recorder restarted): what the old one completed
        is audio, its cut-short end is not."""
        with contextlib.suppress(ProtocolError):
            self._deliver(self.decoder.flush(), now)
        self.decoder = self._new_decoder()

    def start_at(self, seconds: float) -> None:
        """A stream taken over from another process: its client sends a new file from ``seconds`` into the stream."""
        self.seconds = seconds

    def _deliver(self, samples: Samples, now: float) -> None:
        if samples.sample_rate == 0:
            return  # the header is not complete yet
        audio = samples.audio
        if self.transcripts == 1:
            audio = downmix(audio)[None, :]
        elif self.transcripts is not None and samples.channels != self.transcripts:
            raise UnsupportedAudio(
                f"channels={self.transcripts} asks for one transcript per channel, and the container holds "
                f"{samples.channels} channel{'s' if samples.channels > 1 else ''}"
            )
        if not samples.frames:
            return
        self.seconds += samples.frames / samples.sample_rate
        self._sink(Samples(audio, samples.sample_rate), now)
