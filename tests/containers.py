"""Containerised audio made at test time with PyAV (FFmpeg's encoders and muxers), shaped like what real clients send:
WebM/Opus as a browser's MediaRecorder writes it (a Segment and Clusters of unknown size), Ogg/Opus with a page per
packet as a streaming encoder flushes it, WAV with or without a known data length."""

from __future__ import annotations

import io
import struct

import av
import numpy as np
import numpy.typing as npt

from streamer.core.demux import ogg_crc
from streamer.core.matroska import CLUSTER, SEGMENT, read_vint

__all__ = [
    "decode_whole",
    "encode",
    "ogg_page",
    "webm_elements",
]


class _Sink:
    """A write-only file: FFmpeg's muxers then write as a live stream does, never seeking back to fill in sizes."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []

    def write(self, data: bytes) -> int:
        self.parts.append(bytes(data))
        return len(data)


def encode(
    audio: npt.NDArray[np.float32],
    rate: int,
    container: str = "webm",
    codec: str = "libopus",
    bit_rate: int = 32000,
) -> bytes:
    """``audio`` (``(n,)`` mono or ``(channels, n)``, float in [-1, 1] at ``rate`` Hz) as a file of ``container``
    (``webm``, ``ogg``, ``wav``, ``matroska``) in ``codec`` (an FFmpeg encoder: ``libopus``, ``pcm_s16le``, ``aac``,
    ...). Opus is encoded at 48 kHz, 20 ms per packet, as MediaRecorder does."""
    planar = np.atleast_2d(np.asarray(audio, dtype=np.float32))
    layout = {1: "mono", 2: "stereo", 6: "5.1"}[planar.shape[0]]
    sink = _Sink()
    options = {"page_duration": "20000"} if container == "ogg" else {}
    with av.open(sink, "w", format=container, options=options) as out:  # type: ignore[arg-type]
        stream = out.add_stream(codec, rate=48000 if codec == "libopus" else rate)
        stream.layout = layout  # type: ignore[union-attr]
        if codec in ("libopus", "aac"):
            stream.bit_rate = bit_rate
        frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(planar), format="fltp", layout=layout)
        frame.sample_rate = rate
        for packet in stream.encode(frame):  # type: ignore[union-attr]
            out.mux(packet)
        for packet in stream.encode(None):  # type: ignore[union-attr]
            out.mux(packet)
    data = b"".join(sink.parts)
    return _unknown_cluster_sizes(data) if container == "webm" else data


def webm_elements(data: bytes) -> list[tuple[int, int, int]]:
    """``(id, offset, end)`` of each element at the Segment's level and above, walking sizes from the start
    (descending into the Segment and into Clusters)."""
    found = []
    at = 0
    while at < len(data):
        element, id_length = read_vint(data, at, max_length=4, keep_marker=True)
        size, size_length = read_vint(data, at + id_length)
        body = at + id_length + size_length
        unknown = size == (1 << (7 * size_length)) - 1
        if element in (SEGMENT, CLUSTER):
            found.append((element, at, len(data) if unknown else body + size))
            at = body
            continue
        found.append((element, at, body + size))
        at = body + size
    return found


def _unknown_cluster_sizes(data: bytes) -> bytes:
    """MediaRecorder cannot know a Cluster's size when it starts writing it: it marks it unknown (all value bits
    set), as FFmpeg does only for the Segment. Same length, so every offset stays."""
    patched = bytearray(data)
    for element, at, _ in webm_elements(data):
        if element == CLUSTER:
            size_at = at + 4
            _, length = read_vint(data, size_at)
            patched[size_at : size_at + length] = ((1 << (7 * length + 1)) - 1).to_bytes(length, "big")
    return bytes(patched)


def decode_whole(data: bytes) -> npt.NDArray[np.float32]:
    """The reference: PyAV's own demuxer and decoder on the whole file, as float32 ``(channels, n)``."""
    arrays = []
    with av.open(io.BytesIO(data)) as container:
        for frame in container.decode(audio=0):
            array = frame.to_ndarray()
            if not frame.format.is_planar:  # interleaved: one row of frames x channels
                array = array.reshape(-1, len(frame.layout.channels)).T
            arrays.append(array)
    audio = np.concatenate(arrays, axis=1)
    if audio.dtype == np.int16:
        return audio.astype(np.float32) / np.float32(32768)
    return np.asarray(audio, dtype=np.float32)


def ogg_page(serial: int, sequence: int, packet: bytes, flags: int = 0, granule: int = 0) -> bytes:
    """One Ogg page holding ``packet`` whole (RFC 3533 section 6), with its checksum."""
    lacing = bytes([255] * (len(packet) // 255) + [len(packet) % 255])
    header = struct.pack("<4sBBqIIIB", b"OggS", 0, flags, granule, serial, sequence, 0, len(lacing)) + lacing
    page = header + packet
    crc = ogg_crc(page)
    return page[:22] + struct.pack("<I", crc) + page[26:]
