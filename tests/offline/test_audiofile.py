from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile

from streamer.core.errors import AudioFileError
from streamer.offline.audiofile import LoadedAudio, load_audio, sniff_format

DATA = Path(__file__).resolve().parents[2] / ".." / "shared" / "data"
needs_data = pytest.mark.skipif(not DATA.is_dir(), reason="real speech not found at ../shared/data")


def tone(seconds: float, rate: int, freq: float = 440.0) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    return (0.5 * np.sin(2 * np.pi * freq * t)).astype(np.float32)


@pytest.fixture
def no_ffmpeg(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("shutil.which", lambda *args, **kwargs: None)


@pytest.fixture(params=["ffmpeg", "no_ffmpeg"])
def decoders(request: pytest.FixtureRequest) -> None:
    """Run the test with the machine's ffmpeg on PATH and again without it: what a user reads must not depend on
    whether ffmpeg is installed. Where it is not, only the run without it is left (the other is skipped)."""
    if request.param == "no_ffmpeg":
        request.getfixturevalue("no_ffmpeg")
    elif shutil.which("ffmpeg") is None:
        pytest.skip("ffmpeg is not on PATH")


def test_16k_mono_wav_is_read_as_is(tmp_path: Path) -> None:
    x = tone(1.0, 16000)
    soundfile.write(tmp_path / "a.wav", x, 16000, subtype="FLOAT")
    audio = load_audio(tmp_path / "a.wav")
    assert isinstance(audio, LoadedAudio)
    assert (audio.source_rate, audio.channels, audio.duration) == (16000, 1, 1.0)
    assert audio.samples.dtype == np.float32
    np.testing.assert_array_equal(audio.samples, x)
    assert audio.channel_samples == ()


def test_stereo_44k_flac_is_resampled_and_downmixed(tmp_path: Path) -> None:
    left, right = tone(2.0, 44100, 300), tone(2.0, 44100, 500) * 0.5
    soundfile.write(tmp_path / "s.flac", np.stack([left, right], axis=1), 44100)
    audio = load_audio(tmp_path / "s.flac", keep_channels=True)
    assert (audio.source_rate, audio.channels) == (44100, 2)
    assert len(audio.samples) == 32000 and audio.duration == pytest.approx(2.0)
    assert len(audio.channel_samples) == 2
    np.testing.assert_allclose(audio.samples, (audio.channel_samples[0] + audio.channel_samples[1]) / 2, atol=1e-6)
    # the left channel is still a 300 Hz tone after resampling
    spectrum = np.abs(np.fft.rfft(audio.channel_samples[0]))
    assert np.argmax(spectrum) * 16000 / len(audio.channel_samples[0]) == pytest.approx(300, abs=1)


def test_8k_int16_is_upsampled(tmp_path: Path) -> None:
    soundfile.write(tmp_path / "t.wav", tone(0.5, 8000), 8000, subtype="PCM_16")
    audio = load_audio(str(tmp_path / "t.wav"))
    assert audio.source_rate == 8000 and len(audio.samples) == 8000


def test_ogg_vorbis(tmp_path: Path) -> None:
    soundfile.write(tmp_path / "v.ogg", tone(1.0, 22050), 22050, format="OGG", subtype="VORBIS")
    assert load_audio(tmp_path / "v.ogg").duration == pytest.approx(1.0, abs=0.01)


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("missing.wav", None, "no such file"),
        ("", None, "is a directory"),
        ("empty.wav", b"", "is empty"),
        ("bad.wav", os.urandom(4000), r"bad\.wav looks like WAV but cannot be decoded \(corrupt\?\): \w"),
        ("bad.flac", b"fLaC" + os.urandom(400), r"bad\.flac looks like FLAC but cannot be decoded \(corrupt\?\): \w"),
    ],
)
@pytest.mark.usefixtures("decoders")
def test_unusable_files_raise_one_line_errors(tmp_path: Path, name: str, content: bytes | None, message: str) -> None:
    path = tmp_path / name
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(AudioFileError, match=message) as raised:
        load_audio(path)
    # one line that names the file once: the decoder's own reason does not repeat it
    assert "\n" not in str(raised.value) and str(raised.value).count(str(path)) == 1


@pytest.mark.usefixtures("decoders")
def test_a_valid_header_without_samples_is_empty(tmp_path: Path) -> None:
    soundfile.write(tmp_path / "zero.wav", np.zeros(0, dtype=np.float32), 16000)
    with pytest.raises(AudioFileError, match="no audio samples"):
        load_audio(tmp_path / "zero.wav")


@pytest.mark.skipif(sys.platform == "win32" or os.geteuid() == 0, reason="root reads everything")
def test_unreadable_file(tmp_path: Path) -> None:
    path = tmp_path / "locked.wav"
    soundfile.write(path, tone(0.1, 16000), 16000)
    path.chmod(0)
    with pytest.raises(AudioFileError, match="permission denied"):
        load_audio(path)


@pytest.mark.usefixtures("no_ffmpeg")
def test_formats_that_need_ffmpeg_say_so(tmp_path: Path) -> None:
    path = tmp_path / "voice.m4a"
    path.write_bytes(b"\x00\x00\x00\x20ftypM4A " + os.urandom(500))
    with pytest.raises(AudioFileError, match=r"voice\.m4a is MP4/M4A; install ffmpeg to read it"):
        load_audio(path)


@pytest.mark.usefixtures("no_ffmpeg")
def test_unknown_bytes_suggest_ffmpeg(tmp_path: Path) -> None:
    path = tmp_path / "mystery"
    path.write_bytes(os.urandom(500))
    with pytest.raises(AudioFileError, match="install ffmpeg"):
        load_audio(path)


def test_sniffing_prefers_content_to_extension(tmp_path: Path) -> None:
    path = tmp_path / "really_flac.wav"
    soundfile.write(path, tone(0.1, 16000), 16000, format="FLAC")
    assert sniff_format(path) == "FLAC"
    assert sniff_format(tmp_path / "nothing.webm") == "WebM/Matroska"
    assert load_audio(path).duration == pytest.approx(0.1)


def _fake_tools(directory: Path, ffmpeg_body: str) -> None:
    """Executables named ffmpeg and ffprobe that behave like the real ones for one file."""
    ffprobe = 'import json; print(json.dumps({"streams": [{"sample_rate": "48000", "channels": 2}]}))'
    for name, body in (("ffmpeg", ffmpeg_body), ("ffprobe", ffprobe)):
        script = directory / name
        script.write_text(f"#!{sys.executable}\nimport sys\n{body}\n")
        script.chmod(script.stat().st_mode | stat.S_IEXEC)


@pytest.mark.skipif(sys.platform == "win32", reason="shebang scripts")
def test_other_formats_go_through_ffmpeg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tools = tmp_path / "bin"
    tools.mkdir()
    # 0.5 s of 16 kHz stereo f32le: left 0.25, right -0.75, as `-ac 2 -ar 16000 -f f32le -` asks
    body = (
        "import numpy as np\n"
        "assert sys.argv[sys.argv.index('-ac') + 1] == '2' and sys.argv[sys.argv.index('-ar') + 1] == '16000'\n"
        "sys.stdout.buffer.write(np.tile(np.array([0.25, -0.75], '<f4'), 8000).tobytes())"
    )
    _fake_tools(tools, body)
    monkeypatch.setenv("PATH", f"{tools}{os.pathsep}{os.environ['PATH']}")
    path = tmp_path / "clip.m4a"
    path.write_bytes(b"\x00\x00\x00\x20ftypM4A " + os.urandom(500))
    audio = load_audio(path, keep_channels=True)
    assert (audio.source_rate, audio.channels, len(audio.samples)) == (48000, 2, 8000)
    np.testing.assert_allclose(audio.samples, -0.25)
    np.testing.assert_allclose(audio.channel_samples[1], -0.75)


@pytest.mark.skipif(sys.platform == "win32", reason="shebang scripts")
def test_ffmpeg_failure_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tools = tmp_path / "bin"
    tools.mkdir()
    # as the real one does: the input's name, as given after -i, leads the reason
    body = "name = sys.argv[sys.argv.index('-i') + 1]\nsys.stderr.write(f'Input #0\\n{name}: Invalid data found\\n')"
    _fake_tools(tools, f"{body}\nsys.exit(1)")
    monkeypatch.setenv("PATH", f"{tools}{os.pathsep}{os.environ['PATH']}")
    path = tmp_path / "clip.m4a"
    path.write_bytes(b"\x00\x00\x00\x20ftypM4A ")
    message = r"clip\.m4a looks like MP4/M4A but cannot be decoded \(corrupt\?\): ffmpeg says: Invalid data found$"
    with pytest.raises(AudioFileError, match=message) as raised:
        load_audio(path)
    assert "\n" not in str(raised.value) and str(raised.value).count(str(path)) == 1


@pytest.mark.skipif(shutil.which("ffmpeg") is None, reason="ffmpeg is not on PATH")
def test_the_installed_ffmpeg_reads_what_soundfile_cannot(tmp_path: Path) -> None:
    source = tmp_path / "tone.wav"
    soundfile.write(source, np.stack([tone(1.0, 44100, 300), tone(1.0, 44100, 300)], axis=1), 44100)
    path = tmp_path / "tone.m4a"
    command = ["ffmpeg", "-nostdin", "-hide_banner", "-loglevel", "error", "-i", str(source), "-c:a", "aac", str(path)]
    subprocess.run(command, check=True)
    audio = load_audio(path)
    assert (audio.source_rate, audio.channels) == (44100, 2)
    assert audio.duration == pytest.approx(1.0, abs=0.05)  # AAC frames pad the end
    spectrum = np.abs(np.fft.rfft(audio.samples))
    assert np.argmax(spectrum) * 16000 / len(audio.samples) == pytest.approx(300, abs=2)


@needs_data
@pytest.mark.usefixtures("decoders")
def test_the_same_speech_in_three_encodings() -> None:
    wav = load_audio(DATA / "jfk" / "jfk.wav")
    flac = load_audio(DATA / "jfk" / "jfk.flac")
    mp3 = load_audio(DATA / "jfk" / "jfk.mp3")
    assert (flac.source_rate, flac.channels) == (44100, 2)
    for audio in (flac, mp3):
        assert audio.duration == pytest.approx(wav.duration, abs=0.1)
    # the 44.1 kHz stereo master resampled here matches the published 16 kHz mono file closely
    n = min(len(wav.samples), len(flac.samples))
    correlation = np.corrcoef(wav.samples[:n], flac.samples[:n])[0, 1]
    assert correlation > 0.9
