"""Reading audio files for offline transcription: any rate, any channel count, into 16 kHz mono float32.

WAV, FLAC, OGG (Vorbis/Opus), AIFF and -- with libsndfile 1.1 or later -- MP3 are read in-process by soundfile;
anything else (M4A/AAC, WebM, video containers...) goes through the ``ffmpeg`` binary when it is on ``PATH``. Every
way a file can be unusable -- missing, a directory, empty, corrupt, a format nothing here can decode -- raises
:class:`~streamer.core.errors.AudioFileError` with a one-line message that says what to do.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import numpy.typing as npt

from streamer.core.audio import Resampler, downmix
from streamer.core.errors import AudioFileError
from streamer.core.units import SAMPLE_RATE

__all__ = ["LoadedAudio", "load_audio", "sniff_format"]

AudioArray = npt.NDArray[np.float32]

_RESAMPLE_BLOCK = 1 << 16  # input samples per resampler call: bounds the resampler's working memory on long files
_FFMPEG_TIMEOUT_S = 600.0  # a decode that takes longer than this is stuck, not slow

# Leading bytes of the containers we can name in a message (offset, magic, name, soundfile can read it).
_MAGIC: tuple[tuple[int, bytes, str, bool], ...] = (
    (0, b"RIFF", "WAV", True),
    (0, b"RF64", "WAV", True),
    (0, b"fLaC", "FLAC", True),
    (0, b"OggS", "OGG", True),
    (0, b"FORM", "AIFF", True),
    (0, b"ID3", "MP3", True),
    (4, b"ftyp", "MP4/M4A", False),
    (0, b"\x1a\x45\xdf\xa3", "WebM/Matroska", False),
    (0, b"#!AMR", "AMR", False),
    (0, b"\x30\x26\xb2\x75", "WMA/ASF", False),
)
_EXTENSIONS = {
    ".wav": "WAV",
    ".flac": "FLAC",
    ".ogg": "OGG",
    ".oga": "OGG",
    ".opus": "OGG",
    ".aif": "AIFF",
    ".aiff": "AIFF",
    ".mp3": "MP3",
    ".m4a": "MP4/M4A",
    ".mp4": "MP4/M4A",
    ".aac": "AAC",
    ".webm": "WebM/Matroska",
    ".mkv": "WebM/Matroska",
    ".wma": "WMA/ASF",
    ".amr": "AMR",
}


@dataclass(frozen=True)
class LoadedAudio:
    """A decoded file: mono samples at the model rate, plus what the source was."""

    samples: AudioArray  # float32 mono at SAMPLE_RATE (channels averaged)
    source_rate: int  # the file's sample rate in Hz (0 when ffprobe could not say)
    channels: int  # the file's channel count
    duration: float  # seconds of audio, len(samples) / SAMPLE_RATE
    # one float32 array at SAMPLE_RATE per source channel; filled only with load_audio(..., keep_channels=True)
    channel_samples: tuple[AudioArray, ...] = field(default=(), repr=False)


def sniff_format(path: Path) -> str | None:
    """The container named by the file's first bytes, else by its extension; None when neither says."""
    try:
        with path.open("rb") as f:
            head = f.read(16)
    except OSError:
        head = b""
    for offset, magic, name, _ in _MAGIC:
        if head[offset : offset + len(magic)] == magic:
            return name
    # MPEG audio frames without an ID3 tag start with an 11-bit sync word
    if len(head) >= 2 and head[0] == 0xFF and head[1] & 0xE0 == 0xE0:
        return "MP3"
    return _EXTENSIONS.get(path.suffix.lower())


def _soundfile_reads(name: str | None) -> bool:
    import soundfile

    if name == "MP3":
        return "MP3" in soundfile.available_formats()  # libsndfile >= 1.1
    return any(name == n and readable for _, _, n, readable in _MAGIC)


def _check_path(path: Path) -> None:
    if not path.exists():
        raise AudioFileError(f"{path}: no such file")
    if path.is_dir():
        raise AudioFileError(f"{path} is a directory, not an audio file")
    if not os.access(path, os.R_OK):
        raise AudioFileError(f"{path}: permission denied")
    if path.stat().st_size == 0:
        raise AudioFileError(f"{path} is empty (0 bytes)")


def _last_line(text: str, path: Path, default: str) -> str:
    """A decoder's reason: the last line of what it printed, without the file's name that leads it (ffmpeg writes
    ``PATH: reason``, libsndfile ``Error opening 'PATH': reason``); the message names the file once already."""
    lines = text.strip().splitlines()
    if not lines:
        return default
    line = lines[-1].strip()
    for lead in (f"Error opening {str(path)!r}: ", f"{path}: "):
        line = line.removeprefix(lead)
    return line or default


def _undecodable(path: Path, name: str, reason: str) -> AudioFileError:
    """The one message for a file of a known container that no decoder could read, with or without ffmpeg."""
    return AudioFileError(f"{path} looks like {name} but cannot be decoded (corrupt?): {reason}")


def _read_soundfile(path: Path) -> tuple[npt.NDArray[np.float32], int]:
    """``(frames, channels)`` float32 and the sample rate."""
    import soundfile

    data, rate = soundfile.read(str(path), dtype="float32", always_2d=True)
    return np.asarray(data, dtype=np.float32), int(rate)


def _probe(ffmpeg: str, path: Path) -> tuple[int, int]:
    """(sample rate, channels) of the first audio stream, from ffprobe next to ffmpeg; (0, 0) when unknown."""
    ffprobe = shutil.which("ffprobe", path=str(Path(ffmpeg).parent)) or shutil.which("ffprobe")
    if ffprobe is None:
        return 0, 0
    command = [ffprobe, "-v", "error", "-select_streams", "a:0", "-show_entries", "stream=sample_rate,channels"]
    try:
        out = subprocess.run(
            [*command, "-of", "json", str(path)], capture_output=True, check=True, timeout=60, text=True
        ).stdout
        stream = json.loads(out)["streams"][0]
        return int(stream["sample_rate"]), int(stream["channels"])
    except (subprocess.SubprocessError, OSError, ValueError, KeyError, IndexError):
        return 0, 0


def _read_ffmpeg(ffmpeg: str, path: Path, name: str | None) -> tuple[npt.NDArray[np.float32], int, int]:
    """``(frames, channels)`` float32 already at SAMPLE_RATE, the source rate and the source channel count."""
    source_rate, channels = _probe(ffmpeg, path)
    # Without ffprobe the channel count is unknown: let ffmpeg downmix to mono.
    out_channels = channels or 1
    command = [ffmpeg, "-nostdin", "-hide_banner", "-loglevel", "error", "-i", str(path), "-vn"]
    command += ["-f", "f32le", "-acodec", "pcm_f32le", "-ac", str(out_channels), "-ar", str(SAMPLE_RATE), "-"]
    try:
        done = subprocess.run(command, capture_output=True, timeout=_FFMPEG_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise AudioFileError(f"{path}: ffmpeg took over {_FFMPEG_TIMEOUT_S:.0f} s to decode it") from None
    except OSError as error:
        raise AudioFileError(f"{path}: cannot run ffmpeg ({error.strerror})") from None
    if done.returncode != 0:
        said = _last_line(done.stderr.decode(errors="replace"), path, f"exit status {done.returncode}")
        reason = f"ffmpeg says: {said}"
        if name is None:
            raise AudioFileError(f"{path} cannot be decoded: {reason}")
        raise _undecodable(path, name, reason)
    usable = len(done.stdout) - len(done.stdout) % (4 * out_channels)
    frames = np.frombuffer(done.stdout[:usable], dtype="<f4").astype(np.float32).reshape(-1, out_channels)
    return frames, source_rate, channels or 1


def _to_model_rate(channel: npt.NDArray[np.float32], rate: int) -> AudioArray:
    if rate == SAMPLE_RATE:
        return np.ascontiguousarray(channel, dtype=np.float32)
    resampler = Resampler(rate, SAMPLE_RATE)
    parts = [resampler.process(channel[i : i + _RESAMPLE_BLOCK]) for i in range(0, len(channel), _RESAMPLE_BLOCK)]
    parts.append(resampler.flush())
    return np.concatenate(parts).astype(np.float32, copy=False)


def load_audio(path: str | os.PathLike[str], *, keep_channels: bool = False) -> LoadedAudio:
    """Decode ``path`` to 16 kHz mono float32; with ``keep_channels`` also each channel on its own.

    Raises :class:`~streamer.core.errors.AudioFileError` for a file that is missing, a directory, empty, corrupt, or in
    a format that needs ffmpeg when ffmpeg is not installed.
    """
    path = Path(path)
    # 1. What is it? Refuse the things that are not files before reading a byte.
    _check_path(path)
    name = sniff_format(path)
    # 2. Decode: in-process when libsndfile reads the container, else through ffmpeg, else say what to install.
    ffmpeg = shutil.which("ffmpeg")
    soundfile_failure: str | None = None
    if name is None or _soundfile_reads(name):
        try:
            frames, source_rate = _read_soundfile(path)
        except (RuntimeError, ValueError, OSError) as error:  # soundfile.LibsndfileError is a RuntimeError
            soundfile_failure = _last_line(str(error), path, type(error).__name__)
    at_model_rate = False
    if soundfile_failure is not None or not (name is None or _soundfile_reads(name)):
        if ffmpeg is not None:
            # ffmpeg reads what libsndfile cannot (AAC, WebM, WAV with exotic codecs) and gives its own reason
            frames, source_rate, _ = _read_ffmpeg(ffmpeg, path, name)
            at_model_rate = True
        elif name is None:
            raise AudioFileError(f"{path} is not in a format soundfile can read; install ffmpeg to read more formats")
        elif soundfile_failure is not None:
            raise _undecodable(path, name, soundfile_failure)
        else:
            raise AudioFileError(f"{path} is {name}; install ffmpeg to read it")
    channels = frames.shape[1]
    if frames.shape[0] == 0:
        raise AudioFileError(f"{path} holds no audio samples")
    # 3. To the model rate, then to mono: averaging after resampling keeps per-channel audio consistent with it.
    rate = SAMPLE_RATE if at_model_rate else source_rate
    per_channel = tuple(_to_model_rate(frames[:, c], rate) for c in range(channels))
    samples = per_channel[0] if channels == 1 else downmix(np.stack(per_channel))
    if not np.all(np.isfinite(samples)):
        raise AudioFileError(f"{path} holds samples that are not finite numbers (corrupt?)")
    return LoadedAudio(
        samples=samples,
        source_rate=source_rate,
        channels=channels,
        duration=len(samples) / SAMPLE_RATE,
        channel_samples=per_channel if keep_channels else (),
    )
