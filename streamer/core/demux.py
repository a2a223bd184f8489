"""Container demultiplexers for streamed audio: bytes in, the track's format and its packets out.

Sans-I/O, and the part of :mod:`streamer.core.container` that reads containers (the codecs that decode the packets
are there). Each demuxer takes the stream in chunks of any size with :meth:`Demuxer.receive`, which appends to
``out`` a :class:`ContainerTrack` when the container declares its audio track (again for each chained or concatenated
stream) and then every compressed packet of that track, in stream order, as soon as the packet is complete.

Bounds (issue 17: each input costs memory and CPU linear in its own size): a demuxer holds at most one incomplete
element, page or packet, and refuses one declared larger than ``max_element_bytes`` before buffering it; elements
it does not need are skipped as they arrive, whatever size they declare, without being held. Every byte is copied
a bounded number of times (:class:`ByteQueue`).

This module holds what every container shares and the two simple ones: Ogg (RFC 3533, with Opus as RFC 7845 maps
it) and WAV (RIFF). WebM and Matroska are in :mod:`streamer.core.matroska`.
"""

from __future__ import annotations

import struct
import zlib
from abc import ABC, abstractmethod
from dataclasses import dataclass
from enum import StrEnum

from streamer.core.audio import AudioFormat, Encoding
from streamer.core.errors import BadContainer, UnsupportedAudio

__all__ = [
    "MAX_CHANNELS",
    "OPUS_SAMPLE_RATE",
    "ByteQueue",
    "Codec",
    "ContainerFormat",
    "ContainerTrack",
    "Demuxer",
    "OggDemuxer",
    "Packet",
    "WavDemuxer",
    "ogg_crc",
    "opus_track",
    "pcm_track",
]

# one transcript per channel at most two (AudioFormat.validate); a container with more is refused, not mixed
MAX_CHANNELS = 2
OPUS_SAMPLE_RATE = 48000  # an Opus decoder's output rate whatever the input rate was (RFC 7845 section 5.1)


class ContainerFormat(StrEnum):
    """Containers the decoder reads, recognised by their first bytes."""

    WEBM = "webm"  # WebM and Matroska (EBML); browsers' MediaRecorder
    OGG = "ogg"  # Ogg (RFC 3533)
    WAV = "wav"  # RIFF WAVE


class Codec(StrEnum):
    """Codecs of the audio inside a container."""

    OPUS = "opus"  # decoded by PyAV (FFmpeg's Opus decoder)
    PCM = "pcm"  # 16-bit or float PCM, or G.711: decoded by streamer.core.audio.WireDecoder


@dataclass(frozen=True)
class ContainerTrack:
    """The audio track a container declares; a demuxer emits one before the track's first packet."""

    codec: Codec
    # the decoded audio's rate and channels (Opus: always 48 kHz)
    sample_rate: int
    channels: int
    # PCM: how samples are encoded; None for Opus
    encoding: Encoding | None = None
    # Opus: the identification header (OpusHead, RFC 7845 section 5.1) the decoder is opened with
    extradata: bytes = b""

    def describe(self) -> str:
        kind = self.codec.value if self.encoding is None else self.encoding.value
        return f"{kind} at {self.sample_rate} Hz, {self.channels} channel{'s' if self.channels > 1 else ''}"


Packet = bytes  # one compressed packet of the track (PCM: any whole or partial run of frames)


def opus_track(head: bytes) -> ContainerTrack:
    """The track an Opus identification header describes (RFC 7845 section 5.1): ``OpusHead``, version, channels,
    pre-skip, input rate, gain, channel mapping family. Raises :class:`BadContainer` for a malformed header and
    :class:`UnsupportedAudio` for more channels than :data:`MAX_CHANNELS`."""
    if len(head) < 19 or not head.startswith(b"OpusHead"):
        raise BadContainer("the Opus track's identification header is not an OpusHead of at least 19 bytes")
    version, channels = head[8], head[9]
    if version >> 4:  # only the minor version may change without breaking this layout
        raise BadContainer(f"the OpusHead has version {version}; only 0.x is defined")
    if channels == 0:
        raise BadContainer("the OpusHead declares 0 channels")
    if channels > MAX_CHANNELS:
        raise UnsupportedAudio(f"the Opus track has {channels} channels; at most {MAX_CHANNELS} are supported")
    return ContainerTrack(Codec.OPUS, OPUS_SAMPLE_RATE, channels, extradata=bytes(head))


def pcm_track(encoding: Encoding, sample_rate: int, channels: int) -> ContainerTrack:
    """A PCM or G.711 track, validated like the query of a raw stream (:meth:`AudioFormat.validate`)."""
    AudioFormat(encoding=encoding, sample_rate=sample_rate, channels=channels).validate()
    return ContainerTrack(Codec.PCM, sample_rate, channels, encoding=encoding)


class ByteQueue:
    """The bytes a demuxer has received and not yet consumed.

    Consumed bytes are only counted (``_start``) until the next :meth:`append`, which drops them before adding: the
    bytes still held then are the tail of an incomplete element, and they stay at the front, unmoved, until that
    element is complete. So each byte is moved at most once, and appending costs time linear in what is appended."""

    def __init__(self) -> None:
        self._data = bytearray()
        self._start = 0

    def __len__(self) -> int:
        return len(self._data) - self._start

    def append(self, data: bytes) -> None:
        if self._start:
            del self._data[: self._start]
            self._start = 0
        self._data += data

    def peek(self, size: int, offset: int = 0) -> bytes:
        """Up to ``size`` bytes from ``offset`` on, without consuming them."""
        begin = self._start + offset
        return bytes(self._data[begin : begin + size])

    def take(self, size: int) -> bytes:
        """Consume and return the next ``size`` bytes (the caller checked that they are there)."""
        out = self.peek(size)
        self._start += size
        return out

    def drop(self, size: int) -> int:
        """Consume up to ``size`` bytes; return how many were there."""
        dropped = min(size, len(self))
        self._start += dropped
        return dropped


class Demuxer(ABC):
    """The shape of every container reader: :meth:`receive` chunks in stream order, then :meth:`incomplete` once
    the stream has ended."""

    format: ContainerFormat

    def __init__(self, max_element_bytes: int) -> None:
        self.max_element_bytes = max_element_bytes
        self.queue = ByteQueue()
        self._skip = 0  # bytes of an element being skipped that have not arrived yet

    def receive(self, data: bytes, out: list[ContainerTrack | Packet]) -> None:
        """Read the next chunk; append to ``out`` what is now complete. Raises :class:`BadContainer` or
        :class:`UnsupportedAudio` at the first fault, after appending everything that came before it; the caller
        then stops feeding this demuxer."""
        self.queue.append(data)
        self._parse(out)

    @abstractmethod
    def _parse(self, out: list[ContainerTrack | Packet]) -> None:
        """Consume every complete unit of the queue, appending what it carries to ``out``."""

    @abstractmethod
    def incomplete(self) -> str | None:
        """At the end of the stream: what was cut short (an element, a page, a packet, the header), or None when
        the stream ended cleanly between two units."""

    def _skipping(self) -> bool:
        """Drop what has arrived of the element being skipped; True while more of it is still to come."""
        if self._skip:
            self._skip -= self.queue.drop(self._skip)
        return self._skip > 0

    def _check_size(self, size: int, what: str) -> None:
        if size > self.max_element_bytes:
            raise BadContainer(
                f"{what} declares {size} bytes; at most {self.max_element_bytes} are buffered (a corrupt size?)"
            )


# --- Ogg (RFC 3533) -----------------------------------------------------------------------------------------------

_OGG_CAPTURE = b"OggS"
_OGG_HEADER = struct.Struct("<4sBBqIIIB")  # capture, version, flags, granule, serial, sequence, CRC, segments
_OGG_CONTINUED, _OGG_BOS, _OGG_EOS = 0x01, 0x02, 0x04
_OGG_CRC_OFFSET = 22
# the first bytes of other codecs' first packets, to name them when no Opus stream is found (RFC 5334 section 10)
_OGG_CODECS = {b"\x01vorbis": "Vorbis", b"\x7fFLAC": "FLAC", b"Speex   ": "Speex", b"OpusHead": "Opus"}
_REVERSED_BITS = bytes(int(f"{b:08b}"[::-1], 2) for b in range(256))


def ogg_crc(page: bytes) -> int:
    """Ogg's page checksum (RFC 3533 section 6: CRC-32 with polynomial 0x04C11DB7, initial value 0, no reflection
    and no final xor), over a page whose checksum field is zero. zlib computes the bit-reflected CRC-32 at C speed:
    reflecting every input byte and the result turns it into Ogg's, with zlib's own initial and final xors undone."""
    reflected = zlib.crc32(page.translate(_REVERSED_BITS), 0xFFFFFFFF) ^ 0xFFFFFFFF
    return int(f"{reflected:032b}"[::-1], 2)


class OggDemuxer(Demuxer):
    """Ogg pages to the packets of the first Opus logical stream (RFC 7845).

    Pages are at most 65,307 bytes by construction, and each is checked against its CRC. The stream's first packet
    (OpusHead) gives the :class:`ContainerTrack`, its second (OpusTags, which may carry cover art) is skipped as it
    arrives, and the rest are audio packets, reassembled across pages up to ``max_element_bytes``. Pages of other
    logical streams are ignored. After the Opus stream's last page (end of stream), a new Opus stream may begin: a
    chained file, or a recorder restarted on the same connection (RFC 3533 section 4)."""

    format = ContainerFormat.OGG

    def __init__(self, max_element_bytes: int) -> None:
        super().__init__(max_element_bytes)
        self._serial: int | None = None  # the Opus stream being read
        self._packets = 0  # complete packets of that stream so far (0: OpusHead, 1: OpusTags)
        self._packet = bytearray()  # the packet being reassembled across pages
        self._in_packet = False  # whether a packet continues on the next page
        self._dropping = False  # whether that packet is dropped (its start was on a page we never saw)
        self._opus_streams = 0  # Opus logical streams found so far
        self._others: set[str] = set()  # codecs of logical streams that are not Opus, to name them
        self._pages = 0

    def _parse(self, out: list[ContainerTrack | Packet]) -> None:
        queue = self.queue
        while len(queue) >= _OGG_HEADER.size:
            capture, version, flags, _granule, serial, _sequence, crc, segments = _OGG_HEADER.unpack(
                queue.peek(_OGG_HEADER.size)
            )
            if capture != _OGG_CAPTURE or version != 0:
                raise BadContainer(f"Ogg page {self._pages + 1} does not start with OggS version 0")
            if len(queue) < _OGG_HEADER.size + segments:
                return
            lacing = queue.peek(segments, _OGG_HEADER.size)
            size = _OGG_HEADER.size + segments + sum(lacing)
            if len(queue) < size:
                return
            page = bytearray(queue.take(size))
            page[_OGG_CRC_OFFSET : _OGG_CRC_OFFSET + 4] = bytes(4)
            if ogg_crc(bytes(page)) != crc:
                raise BadContainer(f"Ogg page {self._pages + 1} fails its checksum (corrupt data)")
            self._pages += 1
            self._page(flags, serial, lacing, memoryview(page)[_OGG_HEADER.size + segments :], out)

    def _page(
        self, flags: int, serial: int, lacing: bytes, body: memoryview, out: list[ContainerTrack | Packet]
    ) -> None:
        if flags & _OGG_BOS and self._serial is None:
            codec = next((name for magic, name in _OGG_CODECS.items() if body[: len(magic)] == magic), "unknown")
            if codec != "Opus":
                self._others.add(codec)
                return
            self._serial, self._packets, self._in_packet, self._dropping = serial, 0, False, False
            self._packet.clear()
            self._opus_streams += 1
        if serial != self._serial:
            if self._opus_streams == 0 and not flags & _OGG_BOS:
                found = ", ".join(sorted(self._others)) or "no stream"
                raise UnsupportedAudio(f"the Ogg stream holds no Opus audio (found: {found}); only Opus is supported")
            return
        if self._in_packet and not flags & _OGG_CONTINUED:
            self._packet.clear()  # the page that continued the packet is missing: drop its start, not misread it
            self._in_packet = self._dropping = False
        if flags & _OGG_CONTINUED and not self._in_packet:
            self._in_packet = self._dropping = True  # the rest of a packet whose start we never saw: dropped
        offset = 0
        for length in lacing:
            if not self._dropping and self._packets != 1:  # OpusTags (packet 1) is not kept: it may hold a picture
                self._packet += body[offset : offset + length]
                self._check_size(len(self._packet), "an Ogg packet")
            offset += length
            self._in_packet = length == 255  # a lacing value under 255 ends the packet (RFC 3533 section 5)
            if not self._in_packet:
                if self._dropping:
                    self._packet.clear()
                else:
                    self._packet_done(out)
                self._dropping = False
        if flags & _OGG_EOS:
            self._serial = None  # a chained stream may follow

    def _packet_done(self, out: list[ContainerTrack | Packet]) -> None:
        packet = bytes(self._packet)
        self._packet.clear()
        if self._packets == 0:
            out.append(opus_track(packet))
        elif self._packets > 1 and packet:  # an empty packet is a lost frame to conceal; there is nothing to decode
            out.append(packet)
        self._packets += 1

    def incomplete(self) -> str | None:
        if len(self.queue):
            return f"it ends inside an Ogg page ({len(self.queue)} bytes of it arrived)"
        if self._in_packet:
            return "its last packet continues on a page that never came"
        if self._opus_streams == 0:
            found = ", ".join(sorted(self._others))
            return f"it ends before any Opus stream began (found: {found})" if self._pages else None
        if self._serial is not None and self._packets < 2:
            return "it ends before the Opus headers were complete"
        return None


# --- WAV (RIFF) ---------------------------------------------------------------------------------------------------

_RIFF = struct.Struct("<4sI4s")
_CHUNK = struct.Struct("<4sI")
_FMT = struct.Struct("<HHIIHH")  # format tag, channels, rate, bytes per second, block align, bits per sample
_WAVE_FORMAT_PCM, _WAVE_FORMAT_FLOAT, _WAVE_FORMAT_ALAW, _WAVE_FORMAT_MULAW = 1, 3, 6, 7
_WAVE_FORMAT_EXTENSIBLE = 0xFFFE  # the real tag is the first two bytes of the sub-format GUID at offset 24
_WAV_ENCODINGS = {
    (_WAVE_FORMAT_PCM, 16): Encoding.PCM_S16LE,
    (_WAVE_FORMAT_FLOAT, 32): Encoding.PCM_F32LE,
    (_WAVE_FORMAT_MULAW, 8): Encoding.MULAW,
    (_WAVE_FORMAT_ALAW, 8): Encoding.ALAW,
}
# sizes a streaming writer puts in the data chunk before it knows the length: the data runs to the end of the stream
_UNKNOWN_DATA_SIZES = (0, 0xFFFFFFFF)
_MAX_FMT_BYTES = 1024  # 16 to 40 in practice


class WavDemuxer(Demuxer):
    """A RIFF WAVE stream: the ``fmt `` chunk gives the :class:`ContainerTrack`, the ``data`` chunk's bytes are passed
    on as they arrive (the PCM decoder carries incomplete sample frames), other chunks are skipped. A data chunk
    whose size is 0 or 0xFFFFFFFF, as a writer that does not know the length leaves it, runs to the end of the
    stream."""

    format = ContainerFormat.WAV

    def __init__(self, max_element_bytes: int) -> None:
        super().__init__(max_element_bytes)
        self._riff = False  # the RIFF header was read
        self._track: ContainerTrack | None = None
        self._data_left: int | None = 0  # bytes of the data chunk still to come (None: up to the end)
        self._pad = False  # a chunk of odd size is followed by a pad byte

    def _parse(self, out: list[ContainerTrack | Packet]) -> None:
        queue = self.queue
        if not self._riff:
            if len(queue) < _RIFF.size:
                return
            riff, _size, wave = _RIFF.unpack(queue.take(_RIFF.size))
            if riff != b"RIFF" or wave != b"WAVE":
                raise BadContainer("the stream is not a RIFF WAVE file")
            self._riff = True
        while True:
            if self._data_left is None or self._data_left > 0:
                available = len(queue) if self._data_left is None else min(len(queue), self._data_left)
                if available:
                    out.append(queue.take(available))
                if self._data_left is None:
                    return
                self._data_left -= available
                if self._data_left:
                    return
            if self._skipping():
                return
            if self._pad:
                if not queue.drop(1):
                    return
                self._pad = False
            if len(queue) < _CHUNK.size:
                return
            name, size = _CHUNK.unpack(queue.peek(_CHUNK.size))
            if name == b"fmt ":
                if not _FMT.size <= size <= _MAX_FMT_BYTES:
                    raise BadContainer(f"the WAV fmt chunk has {size} bytes; a valid one has 16 to 40")
                if len(queue) < _CHUNK.size + size:
                    return
                queue.drop(_CHUNK.size)
                self._track = self._format(queue.take(size))
                out.append(self._track)
            elif name == b"data":
                if self._track is None:
                    raise BadContainer("the WAV data chunk comes before its fmt chunk")
                queue.drop(_CHUNK.size)
                self._data_left = None if size in _UNKNOWN_DATA_SIZES else size
            else:
                queue.drop(_CHUNK.size)
                self._skip = size
            self._pad = bool(size % 2)  # every chunk is padded to an even size (after its data, for data)

    @staticmethod
    def _format(chunk: bytes) -> ContainerTrack:
        tag, channels, rate, _byte_rate, block_align, bits = _FMT.unpack(chunk[: _FMT.size])
        if tag == _WAVE_FORMAT_EXTENSIBLE:
            if len(chunk) < 26:
                raise BadContainer("the WAV fmt chunk is WAVE_FORMAT_EXTENSIBLE but lacks its sub-format")
            tag = struct.unpack_from("<H", chunk, 24)[0]
        encoding = _WAV_ENCODINGS.get((tag, bits))
        if encoding is None:
            raise UnsupportedAudio(
                f"WAV format {tag} with {bits}-bit samples is not supported; use 16-bit PCM, 32-bit float, "
                "mu-law or A-law"
            )
        if channels and block_align != channels * encoding.bytes_per_sample:
            raise BadContainer(f"the WAV fmt chunk's block align {block_align} does not match {channels} x {bits} bits")
        if channels > MAX_CHANNELS:
            raise UnsupportedAudio(f"the WAV stream has {channels} channels; at most {MAX_CHANNELS} are supported")
        return pcm_track(encoding, rate, channels)

    def incomplete(self) -> str | None:
        if self._data_left is None:
            return None  # data to the end: wherever it stops is its end (an incomplete frame is the codec's)
        if not self._riff:
            return f"it ends inside the RIFF header ({len(self.queue)} bytes)" if len(self.queue) else None
        if self._track is None:
            return "it ends before the WAV fmt chunk"
        if self._data_left:
            return f"its data chunk misses its last {self._data_left} bytes"
        if len(self.queue) or self._skip:
            return "it ends inside a WAV chunk"
        return None
