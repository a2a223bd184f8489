"""Containerised audio, decoded as it streams in: WebM/Matroska and Ogg holding Opus (what browsers' MediaRecorder
and most voice apps send), and WAV with its header. Bytes in, float32 samples out.

Sans-I/O, like :class:`~streamer.core.audio.WireDecoder`: no socket, no clock, no thread. One decoder per stream::

    decoder = ContainerDecoder()                      # any container; ContainerOptions(codec=Codec.OPUS): Opus only
    samples = decoder.receive(chunk)                  # chunks of any size, split anywhere, in stream order
    samples.audio                                     # float32 (channels, frames), in [-1, 1]; frames may be 0
    samples.sample_rate                               # the container's rate (0 until its header has been read)
    decoder.sample_rate, decoder.channels             # the same, once known (None before)
    ...
    tail = decoder.flush()                            # end of input: the last samples; never raises
    decoder.check_complete()                          # then: BadContainer if the input was cut short

Audio comes out as soon as each packet is complete: a WebM block, an Ogg packet, a run of WAV frames; nothing
waits for the end of the file. The sample rate and channel count are the container's (Opus decodes at 48 kHz);
resampling to the model's rate is the caller's (:class:`~streamer.core.audio.Resampler`).

Errors. :meth:`ContainerDecoder.receive` raises :class:`~streamer.core.errors.BadContainer` (not a WebM, Ogg or WAV
stream; a corrupt element, page or packet), :class:`~streamer.core.errors.UnsupportedAudio` (a codec or format the
server does not decode, more than two channels) or :class:`~streamer.core.errors.FrameTooLarge` (one chunk that
decodes to more than ``max_seconds_per_receive``). Nothing decoded before the fault is lost: the caller then calls
:meth:`~ContainerDecoder.flush`, which returns the audio of every packet before the faulty one, feeds it on like any
other, and reports the error. A stream that ends inside an element is found by
:meth:`~ContainerDecoder.check_complete` after the last :meth:`~ContainerDecoder.flush`.

Bounds (issue 17): the decoder holds at most one incomplete element, page or packet, and refuses one declared
larger than ``max_element_bytes`` before buffering it; elements it does not need are skipped as they arrive,
whatever size they declare. A compressed packet can stand for much more audio than its size (a 3-byte Opus packet
is up to 120 ms), so the audio one call may produce is capped (``max_seconds_per_receive``): memory per call is
bounded by that, and a caller's audio rate limit, charged with what each call returns, bounds the rest.

Opus is decoded by PyAV (FFmpeg's decoder; ``pip install av``), imported when a decoder is made, not when this
module is. The containers are read by :mod:`streamer.core.demux` and :mod:`streamer.core.matroska`.
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from dataclasses import dataclass
from enum import Enum, StrEnum
from types import ModuleType
from typing import Any

import numpy as np
import numpy.typing as npt

from streamer.core.audio import AudioFormat, WireDecoder
from streamer.core.demux import (
    MAX_CHANNELS,
    Codec,
    ContainerFormat,
    ContainerTrack,
    Demuxer,
    OggDemuxer,
    Packet,
    WavDemuxer,
)
from streamer.core.errors import (
    BadContainer,
    ConfigError,
    FrameTooLarge,
    InvalidState,
    MalformedMessage,
    ProtocolError,
    UnsupportedAudio,
)
from streamer.core.matroska import MatroskaDemuxer

__all__ = [
    "MAX_CHANNELS",
    "Codec",
    "ContainerDecoder",
    "ContainerEncoding",
    "ContainerFormat",
    "ContainerOptions",
    "DecoderState",
    "Samples",
    "detect",
]

AudioArray = npt.NDArray[np.float32]

# How each container begins: EBML's magic number (RFC 8794 section 8), Ogg's capture pattern, RIFF ... WAVE.
_MAGIC = {b"\x1a\x45\xdf\xa3": ContainerFormat.WEBM, b"OggS": ContainerFormat.OGG}
_DETECT_BYTES = 12  # "RIFF", size, "WAVE"
_DEMUXERS: dict[ContainerFormat, type[Demuxer]] = {
    ContainerFormat.WEBM: MatroskaDemuxer,
    ContainerFormat.OGG: OggDemuxer,
    ContainerFormat.WAV: WavDemuxer,
}


class ContainerEncoding(StrEnum):
    """What a client may declare instead of a sample encoding (``/v1/listen?encoding=...``): audio in a container,
    whose rate and channels the container gives."""

    OPUS = "opus"  # Opus in WebM or Ogg (Deepgram's encoding=opus)
    CONTAINER = "container"  # any container this module reads: WebM, Ogg, WAV

    @property
    def codec(self) -> Codec | None:
        """The codec the stream must hold (None: any)."""
        return Codec.OPUS if self is ContainerEncoding.OPUS else None


@dataclass(frozen=True)
class ContainerOptions:
    """What a decoder accepts. Validated in :meth:`validate`."""

    # the codec the stream must hold (Codec.OPUS for a client that said encoding=opus); None: any supported
    codec: Codec | None = None
    # largest element, page or packet held whole, in bytes: a WebM block of 20 ms of Opus is ~100 bytes, of 20 ms of
    # 48 kHz stereo float PCM 7.7 KB, a Tracks element well under 1 KB; an Ogg page is at most 65,307 bytes anyway
    max_element_bytes: int = 1 << 20
    # most audio one receive() may decode, in seconds per channel: a chunk that decodes to more gets FrameTooLarge.
    # Bounds a call's memory (60 s of 48 kHz stereo float32: 23 MB) whatever the packets' compression ratio
    max_seconds_per_receive: float = 60.0

    def validate(self) -> None:
        """Raise :class:`~streamer.core.errors.ConfigError` naming the first invalid field."""
        if self.codec is not None and not isinstance(self.codec, Codec):
            raise ConfigError(f"codec must be one of {', '.join(c.value for c in Codec)}, not {self.codec!r}")
        if self.max_element_bytes < 4096:
            raise ConfigError("max_element_bytes must be at least 4096")
        if self.max_seconds_per_receive <= 0:
            raise ConfigError("max_seconds_per_receive must be > 0")


@dataclass(frozen=True)
class Samples:
    """Decoded audio: float32 ``(channels, frames)`` in [-1, 1] at ``sample_rate`` Hz. Before the container's header
    has been read, ``audio`` has shape ``(0, 0)`` and ``sample_rate`` is 0."""

    audio: AudioArray
    sample_rate: int

    @property
    def frames(self) -> int:
        """Samples per channel."""
        return int(self.audio.shape[1])

    @property
    def channels(self) -> int:
        return int(self.audio.shape[0])


class DecoderState(Enum):
    DETECTING = "detecting"  # fewer bytes than the container's magic number so far
    DECODING = "decoding"
    FAILED = "failed"  # receive raised; flush() returns what was decoded before the fault
    FLUSHED = "flushed"  # flush() was called: no more input


def detect(head: bytes) -> ContainerFormat | None:
    """The container whose first bytes ``head`` are, or None when more bytes are needed to tell. Raises
    :class:`~streamer.core.errors.BadContainer` when they are not the start of any container this module reads."""
    for magic, container in _MAGIC.items():
        if head[: len(magic)] == magic[: len(head)]:
            return container if len(head) >= len(magic) else None
    if head[:4] == b"RIFF"[: len(head)] and (len(head) < _DETECT_BYTES or head[8:12] == b"WAVE"):
        return ContainerFormat.WAV if len(head) >= _DETECT_BYTES else None
    raise BadContainer(f"the audio is not a WebM, Ogg or WAV stream (it starts with {head[:8].hex(' ')})")


def _import_av() -> ModuleType:
    try:
        return importlib.import_module("av")
    except ImportError:
        raise UnsupportedAudio(
            "this server cannot decode containerised audio: PyAV is not installed (pip install 'av>=14')"
        ) from None


class _Decoder(ABC):
    """One track's codec: packets in, ``(channels, frames)`` float32 out."""

    @abstractmethod
    def decode(self, packet: Packet) -> AudioArray: ...

    @abstractmethod
    def drain(self) -> AudioArray:
        """End of the track: what the codec still holds."""

    def leftover(self) -> int:
        """Bytes at the end of the track that did not make a whole sample frame."""
        return 0


class _PcmDecoder(_Decoder):
    def __init__(self, track: ContainerTrack) -> None:
        assert track.encoding is not None
        self._wire = WireDecoder(AudioFormat(track.encoding, track.sample_rate, track.channels))
        self._leftover = 0

    def decode(self, packet: Packet) -> AudioArray:
        try:
            return self._wire.decode(packet)
        except MalformedMessage as error:  # NaN or infinite floats: a bad container's content, not a bad message
            raise BadContainer(error.message) from None

    def drain(self) -> AudioArray:
        self._leftover = self._wire.flush()
        return np.zeros((self._wire.format.channels, 0), dtype=np.float32)

    def leftover(self) -> int:
        return self._leftover


class _OpusDecoder(_Decoder):
    """FFmpeg's Opus decoder through PyAV, opened with the track's OpusHead: it applies the header's pre-skip and
    decodes every packet to 48 kHz planar float."""

    def __init__(self, track: ContainerTrack, av: ModuleType) -> None:
        self._av = av
        self._channels = track.channels
        self._context: Any = av.CodecContext.create("opus", "r")
        self._context.extradata = track.extradata
        self._context.thread_count = 1  # audio decoding gains nothing from threads; one stream, one core at most

    def decode(self, packet: Packet) -> AudioArray:
        try:
            frames = self._context.decode(self._av.Packet(packet))
        except self._av.FFmpegError as error:
            raise BadContainer(f"an Opus packet could not be decoded ({error.strerror})") from None
        return self._planar(frames)

    def drain(self) -> AudioArray:
        try:
            return self._planar(self._context.decode(None))
        except self._av.FFmpegError:
            return self._planar([])

    def _planar(self, frames: list[Any]) -> AudioArray:
        arrays = [np.asarray(frame.to_ndarray(), dtype=np.float32) for frame in frames]
        if any(a.shape[0] != self._channels for a in arrays):  # fltp: one row per channel
            raise BadContainer(f"the Opus decoder did not return {self._channels} channels of float audio")
        if not arrays:
            return np.zeros((self._channels, 0), dtype=np.float32)
        return np.ascontiguousarray(np.concatenate(arrays, axis=1), dtype=np.float32)


class ContainerDecoder:
    """One stream of containerised audio; see the module docstring for the calls, their order and the bounds.

    The first bytes decide the container (:func:`detect`); its first audio track of a supported codec is decoded,
    other tracks are skipped. A stream may hold several files one after the other (a chained Ogg, a recorder
    restarted on the same connection) as long as they keep the first one's rate and channels."""

    def __init__(self, options: ContainerOptions | None = None) -> None:
        self.options = options if options is not None else ContainerOptions()
        self.options.validate()
        self._av = _import_av()  # here, not at import: the server refuses the stream up front when it is missing
        self.state = DecoderState.DETECTING
        self._head = b""  # the first bytes, until they tell the container
        self._demuxer: Demuxer | None = None
        self._items: list[ContainerTrack | Packet] = []  # what the demuxer found, not yet decoded
        self._track: ContainerTrack | None = None
        self._codec: _Decoder | None = None
        self._out: list[AudioArray] = []  # decoded, not yet returned
        self._frames_this_call = 0
        self.bytes_received = 0

    @property
    def format(self) -> ContainerFormat | None:
        """The container, once its first bytes have arrived."""
        return None if self._demuxer is None else self._demuxer.format

    @property
    def track(self) -> ContainerTrack | None:
        """The audio track being decoded, once the container has declared it."""
        return self._track

    @property
    def sample_rate(self) -> int | None:
        return None if self._track is None else self._track.sample_rate

    @property
    def channels(self) -> int | None:
        return None if self._track is None else self._track.channels

    def receive(self, data: bytes) -> Samples:
        """Decode the next chunk of the stream; return the audio of every packet it completed (possibly none).

        Raises :class:`~streamer.core.errors.BadContainer`, :class:`~streamer.core.errors.UnsupportedAudio` or
        :class:`~streamer.core.errors.FrameTooLarge` at a fault; the caller then calls :meth:`flush` for the audio
        decoded before it and ends the stream with the error. :class:`~streamer.core.errors.InvalidState` after
        :meth:`flush` or a fault."""
        if self.state in (DecoderState.FAILED, DecoderState.FLUSHED):
            raise InvalidState(f"receive() on a decoder that is {self.state.value}")
        self.bytes_received += len(data)
        self._frames_this_call = 0
        fault: ProtocolError | None = None
        try:
            self._demux(bytes(data))
        except ProtocolError as error:
            fault = error  # what came before it is in self._items, decoded first
        try:
            self._decode_items()
        except ProtocolError as error:
            fault = error  # earlier in the stream than any fault of the demuxer
        if fault is not None:
            self.state = DecoderState.FAILED
            self._items.clear()
            raise fault
        return self._take()

    def flush(self) -> Samples:
        """End of input (or after a fault): the audio decoded and not yet returned, and what the codec still held.
        Never raises for bad input; call :meth:`check_complete` next. Calling it again returns no audio."""
        if self.state is not DecoderState.FAILED and self._codec is not None and self.state is not DecoderState.FLUSHED:
            self._out.append(self._codec.drain())
        if self.state is not DecoderState.FAILED:
            self.state = DecoderState.FLUSHED
        return self._take()

    def check_complete(self) -> None:
        """After :meth:`flush`: raise :class:`~streamer.core.errors.BadContainer` when the stream was cut short
        (inside its header, an element, a page, a packet or a sample frame). Nothing when it ended cleanly, when no
        byte came at all, or when :meth:`receive` already raised its fault."""
        if self.state is DecoderState.FAILED or self.bytes_received == 0:
            return
        if self._demuxer is None:
            raise BadContainer(f"the stream ended after {self.bytes_received} bytes, too few to tell its container")
        reason = self._demuxer.incomplete()
        if reason is None and self._codec is not None and self._codec.leftover():
            reason = f"its last {self._codec.leftover()} bytes are not a whole sample frame"
        if reason is not None:
            raise BadContainer(
                f"the {self._demuxer.format.value} stream was cut short: {reason}; the audio before was decoded"
            )

    # -- inside ---------------------------------------------------------------------------------------------------

    def _demux(self, data: bytes) -> None:
        if self._demuxer is None:
            self._head += data
            container = detect(self._head[:_DETECT_BYTES])
            if container is None:
                return
            self._demuxer = _DEMUXERS[container](self.options.max_element_bytes)
            self.state = DecoderState.DECODING
            data, self._head = self._head, b""
        self._demuxer.receive(data, self._items)

    def _decode_items(self) -> None:
        items, self._items = self._items, []
        for item in items:
            if isinstance(item, ContainerTrack):
                self._open(item)
                continue
            assert self._codec is not None  # every demuxer declares the track before its first packet
            audio = self._codec.decode(item)
            self._frames_this_call += audio.shape[1]
            if self._track is not None and self._frames_this_call > self._max_frames(self._track):
                raise FrameTooLarge(
                    f"one frame of containerised audio may decode to at most "
                    f"{self.options.max_seconds_per_receive:g} s of audio; send smaller chunks"
                )
            if audio.shape[1]:
                self._out.append(audio)

    def _max_frames(self, track: ContainerTrack) -> int:
        return int(self.options.max_seconds_per_receive * track.sample_rate)

    def _open(self, track: ContainerTrack) -> None:
        """The container declared its track (again, for a chained or restarted file): open its decoder."""
        wanted = self.options.codec
        if wanted is not None and track.codec is not wanted:
            raise UnsupportedAudio(f"the stream holds {track.describe()}, and {wanted.value} was asked for")
        if self._track is not None:
            if (track.sample_rate, track.channels) != (self._track.sample_rate, self._track.channels):
                raise UnsupportedAudio(
                    f"a new file in the stream holds {track.describe()}; the first held {self._track.describe()}"
                )
            assert self._codec is not None
            self._out.append(self._codec.drain())
        self._track = track
        self._codec = _OpusDecoder(track, self._av) if track.codec is Codec.OPUS else _PcmDecoder(track)

    def _take(self) -> Samples:
        if self._track is None:
            return Samples(np.zeros((0, 0), dtype=np.float32), 0)
        out, self._out = self._out, []
        if not out:
            return Samples(np.zeros((self._track.channels, 0), dtype=np.float32), self._track.sample_rate)
        audio = out[0] if len(out) == 1 else np.concatenate(out, axis=1)
        return Samples(audio, self._track.sample_rate)
