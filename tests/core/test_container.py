"""The container decoder on WebM/Opus, Ogg/Opus and WAV made by FFmpeg's muxers (tests/containers.py) from real
speech: streamed in small chunks it gives exactly what FFmpeg gives for the whole file, as the bytes arrive; cut or
corrupt input gets bad_container with the audio before the fault kept; hostile sizes allocate nothing."""

from __future__ import annotations

import struct
import sys
import tracemalloc
from collections.abc import Iterator

import numpy as np
import numpy.typing as npt
import pytest

from streamer.core.container import (
    Codec,
    ContainerDecoder,
    ContainerEncoding,
    ContainerFormat,
    ContainerOptions,
    DecoderState,
    Samples,
    detect,
)
from streamer.core.demux import ogg_crc
from streamer.core.errors import BadContainer, ConfigError, FrameTooLarge, InvalidState, UnsupportedAudio
from streamer.core.matroska import CLUSTER, SIMPLE_BLOCK
from tests.conftest import load_clip
from tests.containers import decode_whole, encode, ogg_page, webm_elements

OPUS_FRAME = 960  # 20 ms at 48 kHz: every packet FFmpeg's libopus encoder writes here


@pytest.fixture(scope="module")
def speech() -> npt.NDArray[np.float32]:
    return load_clip("1089-134686-0001.flac")  # 3.0 s of LibriSpeech test-clean


def stream(decoder: ContainerDecoder, data: bytes, size: int = 1024) -> Iterator[Samples]:
    for start in range(0, len(data), size):
        yield decoder.receive(data[start : start + size])


def joined(pieces: list[Samples]) -> npt.NDArray[np.float32]:
    """The audio of ``pieces``; those from before the header (shape (0, 0)) have no channels to join."""
    return np.concatenate([p.audio for p in pieces if p.sample_rate], axis=1)


def decode_all(data: bytes, size: int = 1024, **options: object) -> npt.NDArray[np.float32]:
    decoder = ContainerDecoder(ContainerOptions(**options))  # type: ignore[arg-type]
    out = list(stream(decoder, data, size))
    out.append(decoder.flush())
    decoder.check_complete()
    return joined(out)


# -- what real clients send ----------------------------------------------------------------------------------------

CASES = {
    "webm-opus": ("webm", "libopus", 1),  # Chrome's and Firefox's MediaRecorder
    "webm-opus-stereo": ("webm", "libopus", 2),
    "ogg-opus": ("ogg", "libopus", 1),
    "wav-s16": ("wav", "pcm_s16le", 1),
    "wav-f32-stereo": ("wav", "pcm_f32le", 2),
    "wav-mulaw": ("wav", "pcm_mulaw", 1),
    "wav-alaw": ("wav", "pcm_alaw", 1),
    "matroska-pcm": ("matroska", "pcm_s16le", 1),
}


@pytest.mark.parametrize("case", CASES)
def test_streamed_in_1_kib_chunks_it_decodes_exactly_what_ffmpeg_decodes_from_the_whole_file(
    case: str, speech: npt.NDArray[np.float32]
) -> None:
    container, codec, channels = CASES[case]
    audio = speech if channels == 1 else np.stack([speech, -0.5 * speech])
    data = encode(audio, 16000, container, codec)
    reference = decode_whole(data)
    decoded = decode_all(data)
    assert decoded.dtype == np.float32 and decoded.shape[0] == channels
    if codec == "libopus":
        # FFmpeg's demuxer also trims the encoder's padding of the last packet (Ogg granule, WebM DiscardPadding);
        # a stream has no end to trim to, so up to one packet more comes out, all of it near silence
        assert 0 <= decoded.shape[1] - reference.shape[1] < OPUS_FRAME
        assert np.max(np.abs(decoded[:, reference.shape[1] :]), initial=0.0) < 0.05
    else:
        assert decoded.shape == reference.shape
    np.testing.assert_array_equal(decoded[:, : reference.shape[1]], reference)


def test_the_rate_and_channels_are_the_containers(speech: npt.NDArray[np.float32]) -> None:
    decoder = ContainerDecoder()
    assert (decoder.sample_rate, decoder.channels, decoder.format) == (None, None, None)
    first = decoder.receive(encode(np.stack([speech, speech]), 16000, "webm")[:2000])
    assert (decoder.sample_rate, decoder.channels, decoder.format) == (48000, 2, ContainerFormat.WEBM)
    assert first.sample_rate == 48000 and first.channels == 2
    wav = ContainerDecoder()
    samples = wav.receive(encode(speech, 16000, "wav", "pcm_s16le")[:4000])
    assert (wav.sample_rate, wav.channels, samples.sample_rate) == (16000, 1, 16000)
    assert wav.track is not None and wav.track.codec is Codec.PCM


def test_before_the_header_is_complete_nothing_comes_out_and_the_shape_says_so() -> None:
    samples = ContainerDecoder().receive(b"\x1a\x45")
    assert samples.audio.shape == (0, 0) and samples.sample_rate == 0 and samples.frames == 0


@pytest.mark.parametrize("container", ["webm", "ogg"])
def test_audio_comes_out_as_the_bytes_arrive_not_at_the_end(container: str, speech: npt.NDArray[np.float32]) -> None:
    data = encode(speech, 16000, container)
    decoder = ContainerDecoder()
    received = decoded = 0
    for samples in stream(decoder, data, size=256):
        received += 256
        decoded += samples.frames
        # every packet is out once its bytes are in: at most two packets (one in flight, one in a page or block
        # header) behind the share of the audio the bytes so far carry, Opus being close to constant bit rate
        expected = min(received, len(data)) / len(data) * len(speech) * 3
        assert decoded >= expected - 0.25 * 48000, (received, decoded)
    assert decoded > 0.99 * len(speech) * 3


def test_chunk_boundaries_do_not_matter(speech: npt.NDArray[np.float32]) -> None:
    rng = np.random.default_rng(17)
    for container in ("webm", "ogg", "wav"):
        data = encode(speech[:16000], 16000, container, "pcm_s16le" if container == "wav" else "libopus")
        whole = decode_all(data, size=len(data))
        cuts = np.sort(rng.choice(len(data), size=len(data) // 7, replace=False))
        decoder = ContainerDecoder()
        pieces = [decoder.receive(data[a:b]) for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]
        pieces.append(decoder.flush())
        np.testing.assert_array_equal(joined(pieces), whole)
        assert np.array_equal(decode_all(data, size=1), whole)  # one byte at a time


def test_a_stream_of_several_files_decodes_them_one_after_the_other(speech: npt.NDArray[np.float32]) -> None:
    # a chained Ogg (RFC 3533 section 4), and a MediaRecorder restarted on the same connection
    for container in ("ogg", "webm"):
        first, second = encode(speech, 16000, container), encode(speech[::-1].copy(), 16000, container)
        decoded = decode_all(first + second)
        assert decoded.shape[1] == pytest.approx(2 * len(speech) * 3, abs=2 * OPUS_FRAME)
    stereo = encode(np.stack([speech, speech]), 16000, "webm")
    decoder = ContainerDecoder()
    with pytest.raises(UnsupportedAudio, match="first held opus at 48000 Hz, 1 channel"):
        list(stream(decoder, encode(speech, 16000, "webm") + stereo))


# -- faults: named, and the audio before them kept -------------------------------------------------------------------


def test_bytes_that_are_no_container_are_refused_at_once() -> None:
    with pytest.raises(BadContainer, match="not a WebM, Ogg or WAV stream") as info:
        ContainerDecoder().receive(b"\x00\x01\x02\x03 raw pcm")
    assert info.value.code == "bad_container" and info.value.close_code == 4400
    assert detect(b"Og") is None and detect(b"RIFF\0\0\0\0") is None and detect(b"OggS") is ContainerFormat.OGG


@pytest.mark.parametrize("container", ["webm", "ogg", "wav"])
def test_a_stream_cut_short_keeps_every_packet_before_the_cut_and_says_so(
    container: str, speech: npt.NDArray[np.float32]
) -> None:
    codec = "pcm_s16le" if container == "wav" else "libopus"
    data = encode(speech, 16000, container, codec)
    whole = decode_all(data)
    cut = len(data) * 2 // 3 + 1  # inside a block, a page, a 16-bit sample
    decoder = ContainerDecoder()
    got = list(stream(decoder, data[:cut]))
    got.append(decoder.flush())
    decoded = joined(got)
    np.testing.assert_array_equal(decoded, whole[:, : decoded.shape[1]])  # a prefix of the whole, nothing altered
    # everything up to the cut is out: all but the packet (or the page of packets) the cut fell in
    assert decoded.shape[1] >= whole.shape[1] * 0.6
    with pytest.raises(BadContainer, match="cut short") as info:
        decoder.check_complete()
    assert info.value.code == "bad_container"


def test_a_stream_ending_inside_its_header_is_cut_short_and_an_empty_one_is_not() -> None:
    decoder = ContainerDecoder()
    decoder.receive(b"OggS\0\2")
    assert decoder.flush().frames == 0
    with pytest.raises(BadContainer, match="inside an Ogg page"):
        decoder.check_complete()
    empty = ContainerDecoder()
    empty.flush()
    empty.check_complete()  # no byte, no fault: a stream that ended before it began
    riff = ContainerDecoder()
    riff.receive(b"RIF")
    riff.flush()
    with pytest.raises(BadContainer, match="too few to tell its container"):
        riff.check_complete()


def test_a_corrupt_ogg_page_fails_its_checksum_and_the_pages_before_it_are_decoded(
    speech: npt.NDArray[np.float32],
) -> None:
    data = bytearray(encode(speech, 16000, "ogg"))
    whole = decode_all(bytes(data))
    middle = data.index(b"OggS", len(data) // 2)
    data[middle + 40] ^= 0x10  # one bit of an Opus packet
    decoder = ContainerDecoder()
    got: list[Samples] = []
    with pytest.raises(BadContainer, match="fails its checksum") as info:
        got.extend(stream(decoder, bytes(data)))
    assert decoder.state is DecoderState.FAILED
    got.append(decoder.flush())
    decoded = joined(got)
    np.testing.assert_array_equal(decoded, whole[:, : decoded.shape[1]])
    assert decoded.shape[1] >= whole.shape[1] * 0.45  # every page before the corrupt one
    decoder.check_complete()  # the fault was said once, by receive
    assert "checksum" in info.value.message
    with pytest.raises(InvalidState):
        decoder.receive(b"more")


def test_garbage_inside_a_webm_cluster_is_bad_container_and_the_blocks_before_it_are_decoded(
    speech: npt.NDArray[np.float32],
) -> None:
    data = encode(speech, 16000, "webm")
    whole = decode_all(data)
    blocks = [at for element, at, _ in webm_elements(data) if element == SIMPLE_BLOCK]
    cut = blocks[len(blocks) // 2]
    corrupt = data[:cut] + b"\x00\x00\x00\x00" + data[cut:]  # no EBML ID starts with a zero byte
    decoder = ContainerDecoder()
    got: list[Samples] = []
    with pytest.raises(BadContainer, match="EBML number"):
        got.extend(stream(decoder, corrupt))
    got.append(decoder.flush())
    decoded = joined(got)
    assert decoded.shape[1] == len(blocks) // 2 * OPUS_FRAME - 312  # every block before it, less the pre-skip
    np.testing.assert_array_equal(decoded, whole[:, : decoded.shape[1]])


def test_an_undecodable_opus_packet_is_bad_container() -> None:
    data = webm(block(b""))  # an Opus packet must hold at least its TOC byte
    with pytest.raises(BadContainer):
        ContainerDecoder().receive(data + element(SIMPLE_BLOCK, b"\x81\0\0\x80" + b"\xff\xff\xff\xff"))


# -- what is not decoded -----------------------------------------------------------------------------------------


def test_codecs_and_layouts_the_server_does_not_decode_are_named(speech: npt.NDArray[np.float32]) -> None:
    with pytest.raises(UnsupportedAudio, match="A_AAC"):
        decode_all(encode(speech, 16000, "matroska", "aac"))
    with pytest.raises(UnsupportedAudio, match="6 channels"):
        decode_all(encode(np.stack([speech] * 6), 16000, "webm"))
    vorbis = ogg_page(7, 0, b"\x01vorbis" + bytes(23), flags=0x02) + ogg_page(7, 1, b"\x03vorbis")
    with pytest.raises(UnsupportedAudio, match="no Opus audio \\(found: Vorbis\\)"):
        decode_all(vorbis)
    with pytest.raises(UnsupportedAudio, match="24-bit"):
        decode_all(encode(speech, 16000, "wav", "pcm_s24le"))
    opus_only = ContainerDecoder(ContainerOptions(codec=ContainerEncoding.OPUS.codec))
    with pytest.raises(UnsupportedAudio, match="pcm_s16le at 16000 Hz, 1 channel, and opus was asked for"):
        opus_only.receive(encode(speech, 16000, "wav", "pcm_s16le"))


def test_without_pyav_the_decoder_says_how_to_get_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "av", None)  # what an environment without the package looks like to import
    with pytest.raises(UnsupportedAudio, match=r"pip install 'av>=14'"):
        ContainerDecoder()


def test_options_are_validated() -> None:
    for field, value in (("max_element_bytes", 100), ("max_seconds_per_receive", 0), ("codec", "mp3")):
        with pytest.raises(ConfigError, match=field.split("_")[0]):
            ContainerOptions(**{field: value}).validate()  # type: ignore[arg-type]


def test_receive_after_flush_is_a_bug_in_the_caller() -> None:
    decoder = ContainerDecoder()
    decoder.flush()
    assert decoder.flush().frames == 0  # again: nothing more
    with pytest.raises(InvalidState):
        decoder.receive(b"OggS")


# -- hostile containers: memory linear in the input, never in what it declares ---------------------------------------


def vint(value: int, length: int = 8) -> bytes:
    return ((1 << (7 * length)) | value).to_bytes(length, "big")


def element(element_id: int, payload: bytes, size: int | None = None) -> bytes:
    declared = vint(len(payload) if size is None else size)
    return element_id.to_bytes((element_id.bit_length() + 7) // 8, "big") + declared + payload


OPUS_HEAD = b"OpusHead" + bytes([1, 1]) + struct.pack("<HIhB", 312, 48000, 0, 0)
UNKNOWN = (1 << 56) - 1  # an 8-byte size with every value bit set


def webm(*body: bytes, tracks: bytes | None = None) -> bytes:
    """A MediaRecorder-shaped WebM: EBML header, Segment and Cluster of unknown size, one Opus track."""
    entry = element(0xD7, b"\x01") + element(0x83, b"\x02") + element(0x86, b"A_OPUS") + element(0x63A2, OPUS_HEAD)
    header = element(0x1A45DFA3, element(0x4282, b"webm"))
    segment = element(0x18538067, b"", size=UNKNOWN)
    declared = element(0x1654AE6B, element(0xAE, entry)) if tracks is None else tracks
    return header + segment + declared + element(CLUSTER, b"", size=UNKNOWN) + b"".join(body)


def block(packet: bytes) -> bytes:
    return element(SIMPLE_BLOCK, b"\x81\0\0\x80" + packet)  # track 1, timestamp 0, keyframe, no lacing


def peak_memory(feed: Iterator[object]) -> int:
    tracemalloc.start()
    try:
        for _ in feed:
            pass
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_an_element_declaring_a_huge_size_is_refused_before_anything_is_allocated() -> None:
    for hostile in (
        webm(tracks=element(0x1654AE6B, b"", size=1 << 50)),  # Tracks of a petabyte
        webm(element(SIMPLE_BLOCK, b"\x81\0\0\x80", size=1 << 40)),  # a terabyte block of our track
        webm(element(0x4DBB, b"", size=1 << 40)),  # an element no one knows, of a terabyte
    ):
        decoder = ContainerDecoder()
        tracemalloc.start()
        try:
            with pytest.raises(BadContainer, match=r"declares \d+ bytes; at most"):
                decoder.receive(hostile)
            assert tracemalloc.get_traced_memory()[1] < 256 * 1024
        finally:
            tracemalloc.stop()


def test_skipped_elements_of_any_declared_size_are_not_held() -> None:
    # a Void element declaring 2^50 bytes, then 20 MB of them arriving: skipped as they come, none of them kept
    decoder = ContainerDecoder()
    decoder.receive(webm(element(0xEC, b"", size=1 << 50)))
    chunk = bytes(64 * 1024)
    peak = peak_memory(decoder.receive(chunk) for _ in range(320))
    assert peak < 1024 * 1024
    decoder.flush()
    with pytest.raises(BadContainer, match="ends inside an element"):
        decoder.check_complete()
    # another track's blocks (video, say) are skipped the same way, whatever their size
    other = ContainerDecoder()
    other.receive(webm(element(SIMPLE_BLOCK, b"\x82\0\0\x80", size=1 << 40)))
    assert peak_memory(other.receive(chunk) for _ in range(320)) < 1024 * 1024


def test_an_ogg_packet_spanning_pages_past_the_limit_is_refused() -> None:
    head = ogg_page(5, 0, OPUS_HEAD, flags=0x02) + ogg_page(5, 1, b"OpusTags" + bytes(8))
    # pages of 255 segments of 255 bytes each, every one continuing the same packet
    filler = bytes(255 * 255)
    lacing = bytes([255] * 255)
    pages = []
    for sequence in range(2, 40):
        header = struct.pack("<4sBBqIIIB", b"OggS", 0, 0x01 if sequence > 2 else 0, 0, 5, sequence, 0, 255)
        page = header + lacing + filler
        pages.append(page[:22] + struct.pack("<I", ogg_crc(page)) + page[26:])
    decoder = ContainerDecoder(ContainerOptions(max_element_bytes=1 << 20))
    decoder.receive(head)
    with pytest.raises(BadContainer, match="an Ogg packet declares"):
        for page in pages:
            decoder.receive(page)


def test_opus_packets_that_expand_beyond_the_per_call_limit_get_frame_too_large_with_bounded_memory() -> None:
    # 2 bytes of Opus standing for 120 ms of audio (code 3, 48 empty CELT frames of 2.5 ms: concealed, RFC 6716
    # section 3.2.5), 8 bytes of WebM each: 16 KB of this is 4 minutes of audio
    bomb = block(bytes([0xE3, 0x30])) * 2000
    decoder = ContainerDecoder(ContainerOptions(max_seconds_per_receive=10.0))
    decoder.receive(webm())
    tracemalloc.start()
    try:
        with pytest.raises(FrameTooLarge, match="at most 10 s of audio"):
            decoder.receive(bomb)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 * 1024 * 1024  # 10 s of 48 kHz float32 is 1.9 MB; the whole 4 minutes would be 46 MB
    kept = decoder.flush()  # what was decoded within the limit is kept, as after any fault
    assert 9.5 * 48000 < kept.frames <= 10 * 48000
