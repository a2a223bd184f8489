"""WebM and Matroska, read as a stream: the audio track's format and its blocks' frames (a
:class:`~streamer.core.demux.Demuxer`; see :mod:`streamer.core.container` for the decoder built on it).

What browsers' ``MediaRecorder`` writes (``audio/webm;codecs=opus``) is an EBML header, a Segment and Clusters of
*unknown* size (the recorder cannot know them), the Tracks element, then SimpleBlocks as the audio is encoded. So the
reader does not need the sizes of the elements that hold others: it descends into Segment, Cluster and BlockGroup
by reading only their headers (their children's IDs are distinct from every sibling's), reads the EBML header, Tracks
and the blocks of the chosen track whole, and skips everything else as it arrives, whatever its declared size.
Timestamps are not read: the decoded audio of consecutive blocks is consecutive (a stream with gaps plays shorter).

References: RFC 8794 (EBML), RFC 9559 (Matroska), the WebM byte stream format (w3.org/TR/mse-byte-stream-format-webm).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass

from streamer.core.audio import Encoding
from streamer.core.demux import ContainerFormat, ContainerTrack, Demuxer, Packet, opus_track, pcm_track
from streamer.core.errors import BadContainer, UnsupportedAudio

__all__ = ["MatroskaDemuxer", "read_vint"]

# element IDs (RFC 9559 section 5.1), with their length marker bits, as written
EBML = 0x1A45DFA3
DOC_TYPE = 0x4282
SEGMENT = 0x18538067
CLUSTER = 0x1F43B675
BLOCK_GROUP = 0xA0
BLOCK = 0xA1
SIMPLE_BLOCK = 0xA3
TRACKS = 0x1654AE6B
TRACK_ENTRY = 0xAE
TRACK_NUMBER = 0xD7
TRACK_TYPE = 0x83
CODEC_ID = 0x86
CODEC_PRIVATE = 0x63A2
CONTENT_ENCODINGS = 0x6D80
AUDIO = 0xE1
SAMPLING_FREQUENCY = 0xB5
CHANNELS = 0x9F
BIT_DEPTH = 0x6264

_TRACK_TYPE_AUDIO = 2
# containers of other elements whose children are read where they stand (their size, often unknown, is not needed)
_DESCEND = frozenset({SEGMENT, CLUSTER, BLOCK_GROUP})
# elements that are skipped whatever size they declare: everything a stream may carry that is not audio (SeekHead,
# Info, Cues, Tags, Chapters, Attachments, Void, CRC-32, and a cluster's and block group's other children). An
# element not named anywhere here is skipped only up to max_element_bytes: a huge unknown one is corruption.
_SKIP = frozenset(
    {
        0x114D9B74,  # SeekHead
        0x1549A966,  # Info
        0x1C53BB6B,  # Cues
        0x1254C367,  # Tags
        0x1043A770,  # Chapters
        0x1941A469,  # Attachments
        0xEC,  # Void
        0xBF,  # CRC-32
        0xE7,  # Timestamp (cluster)
        0xA7,  # Position
        0xAB,  # PrevSize
        0x9B,  # BlockDuration
        0xFB,  # ReferenceBlock
        0x75A2,  # DiscardPadding
        0x75A1,  # BlockAdditions
        0x8E,  # Slices
        0x5854,  # SilentTracks
    }
)
_HELD = {EBML: "the EBML header", TRACKS: "the Tracks element", SIMPLE_BLOCK: "a SimpleBlock", BLOCK: "a Block"}
_DOC_TYPES = (b"webm", b"matroska")
_PCM_CODECS = {("A_PCM/INT/LIT", 16): Encoding.PCM_S16LE, ("A_PCM/FLOAT/IEEE", 32): Encoding.PCM_F32LE}
_LACING_NONE, _LACING_XIPH, _LACING_FIXED, _LACING_EBML = 0, 1, 2, 3
_MAX_HEADER = 12  # a 4-byte ID and an 8-byte size


def read_vint(data: bytes | memoryview, at: int, max_length: int = 8, keep_marker: bool = False) -> tuple[int, int]:
    """The variable-length integer at ``data[at:]`` (RFC 8794 section 4): its value (the length marker bit removed
    unless ``keep_marker``, as for element IDs) and its length. Raises :class:`IndexError` when ``data`` ends
    inside it and :class:`BadContainer` when its first byte declares more than ``max_length`` bytes."""
    first = data[at]
    length = 9 - first.bit_length() if first else 9
    if length > max_length:
        raise BadContainer(f"an EBML number starts with byte 0x{first:02X}: {length} bytes long, at most {max_length}")
    if at + length > len(data):
        raise IndexError("the data ends inside an EBML number")
    value = first if keep_marker else first & (0xFF >> length)
    for byte in data[at + 1 : at + length]:
        value = value << 8 | byte
    return value, length


@dataclass(frozen=True)
class _Header:
    id: int
    size: int | None  # None: unknown (all value bits set)
    length: int  # bytes of the ID and the size


def _header(data: bytes | memoryview, at: int) -> _Header:
    """The element header at ``data[at:]``; :class:`IndexError` when incomplete."""
    element, id_length = read_vint(data, at, max_length=4, keep_marker=True)
    size, size_length = read_vint(data, at + id_length)
    unknown = size == (1 << (7 * size_length)) - 1
    return _Header(element, None if unknown else size, id_length + size_length)


def _children(data: bytes | memoryview) -> Iterator[tuple[int, memoryview]]:
    """The elements of a master element's body, each as its ID and its payload."""
    view = memoryview(data)
    at = 0
    while at < len(view):
        try:
            header = _header(view, at)
        except IndexError:
            raise BadContainer("an element is cut short inside its parent") from None
        start = at + header.length
        if header.size is None or start + header.size > len(view):
            raise BadContainer(f"element 0x{header.id:X} overruns its parent")
        yield header.id, view[start : start + header.size]
        at = start + header.size


def _uint(payload: memoryview) -> int:
    return int.from_bytes(payload, "big")


def _float(payload: memoryview) -> float:
    if len(payload) == 4:
        return float(struct.unpack(">f", payload)[0])
    if len(payload) == 8:
        return float(struct.unpack(">d", payload)[0])
    raise BadContainer(f"a float element has {len(payload)} bytes; EBML floats have 4 or 8")


@dataclass(frozen=True)
class _Entry:
    """A TrackEntry, as far as choosing and opening an audio track needs."""

    number: int = 0
    type: int = 0
    codec_id: str = ""
    private: bytes = b""
    sample_rate: float = 8000.0  # Matroska's default SamplingFrequency
    channels: int = 1
    bit_depth: int = 0
    encoded: bool = False  # compressed or encrypted frames (ContentEncodings): not supported

    def track(self) -> ContainerTrack:
        """The :class:`ContainerTrack` to decode; :class:`UnsupportedAudio` naming the codec when it cannot be."""
        if self.encoded:
            raise UnsupportedAudio(f"the {self.codec_id} track is compressed or encrypted (ContentEncodings)")
        if self.codec_id == "A_OPUS":
            return opus_track(self.private)
        encoding = _PCM_CODECS.get((self.codec_id, self.bit_depth))
        if encoding is None:
            raise UnsupportedAudio(
                f"the audio track's codec {self.codec_id} ({self.bit_depth or 'no'} bit depth) is not supported; "
                "use Opus, 16-bit integer or 32-bit float PCM"
            )
        rate = int(self.sample_rate)
        if rate != self.sample_rate:
            raise UnsupportedAudio(f"a PCM sampling frequency of {self.sample_rate} Hz is not supported")
        return pcm_track(encoding, rate, self.channels)


def _entry(payload: memoryview) -> _Entry:
    fields: dict[str, object] = {}
    for element, value in _children(payload):
        if element == TRACK_NUMBER:
            fields["number"] = _uint(value)
        elif element == TRACK_TYPE:
            fields["type"] = _uint(value)
        elif element == CODEC_ID:
            fields["codec_id"] = bytes(value).decode("ascii", "replace").rstrip("\0")
        elif element == CODEC_PRIVATE:
            fields["private"] = bytes(value)
        elif element == CONTENT_ENCODINGS:
            fields["encoded"] = True
        elif element == AUDIO:
            for child, setting in _children(value):
                if child == SAMPLING_FREQUENCY:
                    fields["sample_rate"] = _float(setting)
                elif child == CHANNELS:
                    fields["channels"] = _uint(setting)
                elif child == BIT_DEPTH:
                    fields["bit_depth"] = _uint(setting)
    return _Entry(**fields)  # type: ignore[arg-type]


def _frames(body: bytes, at: int, lacing: int) -> list[Packet]:
    """The frames of a block's payload from ``at`` (after track number, timecode and flags), unlaced (RFC 9559
    section 10.3)."""
    if lacing == _LACING_NONE:
        return [body[at:]]
    if at >= len(body):
        raise BadContainer("a laced block ends before its frame count")
    count = body[at] + 1
    at += 1
    sizes: list[int] = []
    try:
        if lacing == _LACING_XIPH:
            for _ in range(count - 1):
                size = 0
                while body[at] == 255:
                    size += 255
                    at += 1
                size += body[at]
                at += 1
                sizes.append(size)
        elif lacing == _LACING_EBML:
            size, length = read_vint(body, at)
            at += length
            sizes.append(size)
            for _ in range(count - 2):
                delta, length = read_vint(body, at)
                at += length
                size += delta - ((1 << (7 * length - 1)) - 1)  # signed: the value minus half its range
                if size < 0:
                    raise BadContainer("an EBML-laced block declares a negative frame size")
                sizes.append(size)
    except IndexError:
        raise BadContainer("a laced block ends inside its lace sizes") from None
    rest = len(body) - at
    if lacing == _LACING_FIXED:
        if rest % count:
            raise BadContainer(f"a fixed-size laced block of {rest} bytes does not split into {count} frames")
        sizes = [rest // count] * (count - 1)
    last = rest - sum(sizes)
    if last < 0:
        raise BadContainer("a laced block's frame sizes overrun the block")
    frames = []
    for size in [*sizes, last]:
        frames.append(body[at : at + size])
        at += size
    return frames


class MatroskaDemuxer(Demuxer):
    """WebM or Matroska to the frames of its first audio track of a supported codec (see the module docstring).

    A new EBML header later in the stream starts a new file (a recorder restarted on the same connection): its
    Tracks element declares the track again."""

    format = ContainerFormat.WEBM

    def __init__(self, max_element_bytes: int) -> None:
        super().__init__(max_element_bytes)
        self._track_number: int | None = None  # the chosen track's TrackNumber, once Tracks is read
        self._elements = 0

    def _parse(self, out: list[ContainerTrack | Packet]) -> None:
        queue = self.queue
        while not self._skipping():
            try:
                header = _header(queue.peek(_MAX_HEADER), 0)
            except IndexError:
                return  # wait for the rest of the header
            if header.id in _DESCEND:
                queue.drop(header.length)
                continue
            if header.size is None:
                raise BadContainer(f"element 0x{header.id:X} has an unknown size; only Segment and Cluster may")
            if header.id in (SIMPLE_BLOCK, BLOCK):
                if self._track_number is None:
                    raise BadContainer("a block comes before the Tracks element")
                try:
                    track, _ = read_vint(queue.peek(8, header.length), 0)
                except IndexError:
                    if len(queue) < header.length + min(header.size, 8):
                        return  # the track number has not arrived yet
                    raise BadContainer("a block is too short for its track number") from None
                if track != self._track_number:  # another track's (video, a second language): not held
                    self._skip_element(header)
                    continue
            elif header.id not in (EBML, TRACKS):
                if header.id not in _SKIP:
                    self._check_size(header.size, f"unknown element 0x{header.id:X}")
                self._skip_element(header)
                continue
            self._check_size(header.size, _HELD[header.id])
            if len(queue) < header.length + header.size:
                return
            queue.drop(header.length)
            self._element(header.id, queue.take(header.size), out)

    def _skip_element(self, header: _Header) -> None:
        self.queue.drop(header.length)
        self._skip = header.size or 0

    def _element(self, element: int, body: bytes, out: list[ContainerTrack | Packet]) -> None:
        self._elements += 1
        if element == EBML:
            doc_type = next((bytes(v) for i, v in _children(body) if i == DOC_TYPE), b"matroska")
            if doc_type.rstrip(b"\0") not in _DOC_TYPES:
                raise BadContainer(f"the EBML document type is {doc_type!r}, not webm or matroska")
            self._track_number = None  # a new file: its Tracks come next
        elif element == TRACKS:
            entries = [_entry(payload) for i, payload in _children(body) if i == TRACK_ENTRY]
            audio = [e for e in entries if e.type == _TRACK_TYPE_AUDIO]
            if not audio:
                raise UnsupportedAudio("the WebM stream has no audio track")
            refusal: UnsupportedAudio | None = None
            for entry in audio:
                try:
                    track = entry.track()
                except UnsupportedAudio as error:
                    refusal = refusal or error
                    continue
                self._track_number = entry.number
                out.append(track)
                return
            assert refusal is not None
            raise refusal
        else:  # a block of the chosen track: track number, 16-bit relative timestamp, flags, frames
            _, at = read_vint(body, 0)
            if len(body) < at + 3:
                raise BadContainer("a block is too short for its timestamp and flags")
            lacing = (body[at + 2] >> 1) & 0x03
            out.extend(frame for frame in _frames(body, at + 3, lacing) if frame)

    def incomplete(self) -> str | None:
        if self._skip:
            return f"it ends inside an element, {self._skip} bytes short"
        if len(self.queue):
            return f"it ends inside an element ({len(self.queue)} bytes of it arrived)"
        if self._track_number is None and self._elements:
            return "it ends before its Tracks element"
        return None
