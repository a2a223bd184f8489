from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest
import soundfile as sf

from streamer.core.errors import ConfigError
from streamer.engine import silero_vad
from streamer.engine.silero_vad import CONTEXT_SAMPLES, FRAME_SAMPLES, SileroClassifier, load_model, model_path

SR = 16000
HERE = Path(__file__).parent.parent / "data"
SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "data"
needs_shared = pytest.mark.skipif(not SHARED.is_dir(), reason=f"shared speech data not found at {SHARED}")


def load(path: Path) -> npt.NDArray[np.float32]:
    x, rate = sf.read(path, dtype="float32", always_2d=True)
    assert rate == SR
    return np.asarray(x[:, 0], dtype=np.float32)


def frames_of(x: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    return x[: len(x) // FRAME_SAMPLES * FRAME_SAMPLES].reshape(-1, FRAME_SAMPLES)


@pytest.fixture(scope="module")
def speech() -> npt.NDArray[np.float32]:
    """Two LibriSpeech utterances joined (about 13 s, 400 frames): real speech with its pauses."""
    return np.concatenate([load(HERE / "1089-134686-0000.flac"), load(HERE / "121-127105-0000.flac")])


def reference_probabilities(x: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    """The package's frame-at-a-time model (its default ONNX export), run as its own OnnxWrapper runs it."""
    import onnxruntime

    path = model_path().parent  # the package's data folder
    session = onnxruntime.InferenceSession(str(path / "silero_vad.onnx"), providers=["CPUExecutionProvider"])
    state = np.zeros((2, 1, 128), dtype=np.float32)
    context = np.zeros((1, CONTEXT_SAMPLES), dtype=np.float32)
    out = []
    for frame in frames_of(x):
        inputs = np.concatenate([context, frame[None, :]], axis=1)
        prob, state = session.run(None, {"input": inputs, "state": state, "sr": np.array(SR, dtype=np.int64)})
        context = inputs[:, -CONTEXT_SAMPLES:]
        out.append(float(prob[0, 0]))
    return np.array(out, dtype=np.float32)


def test_probabilities_are_the_packages_own(speech: npt.NDArray[np.float32]) -> None:
    ours = SileroClassifier().probabilities(frames_of(speech))
    np.testing.assert_allclose(ours, reference_probabilities(speech), atol=1e-4)
    # and the voiced frames are the same ones, with none near enough the threshold for a kernel to flip it
    assert 0.6 < float(np.mean(ours >= 0.5)) < 0.95


@pytest.mark.parametrize("block", [1, 3, 77])
def test_the_stream_state_carries_across_calls(speech: npt.NDArray[np.float32], block: int) -> None:
    frames = frames_of(speech)
    whole = SileroClassifier().probabilities(frames)
    classifier = SileroClassifier()
    pieces = [classifier.probabilities(frames[i : i + block]) for i in range(0, len(frames), block)]
    np.testing.assert_allclose(np.concatenate(pieces), whole, atol=1e-5)


def test_streams_share_the_model_not_the_state(speech: npt.NDArray[np.float32]) -> None:
    assert load_model() is load_model()
    frames = frames_of(speech)
    alone = SileroClassifier().probabilities(frames)
    a, b = SileroClassifier(), SileroClassifier()
    quiet = np.zeros_like(frames[:10])
    interleaved = []
    for i in range(0, len(frames), 10):
        interleaved.append(a.probabilities(frames[i : i + 10]))
        b.probabilities(quiet)  # another stream's silence in between changes nothing for this one
    np.testing.assert_allclose(np.concatenate(interleaved), alone, atol=1e-5)


def test_a_long_chunk_runs_in_bounded_blocks(speech: npt.NDArray[np.float32]) -> None:
    long = np.tile(frames_of(speech), (2, 1))  # 800 frames: more than one block
    assert len(long) > silero_vad._MAX_FRAMES
    np.testing.assert_allclose(
        SileroClassifier().probabilities(long), reference_probabilities(long.reshape(-1)), atol=1e-4
    )


@needs_shared
@pytest.mark.parametrize(
    ("name", "highest"),
    [
        ("synthetic_silence_16k_10s.wav", 0.1),  # measured 0.01, white 0.04, pink 0.05
        ("synthetic_white_noise_16k_10s.wav", 0.1),
        ("synthetic_pink_noise_16k_10s.wav", 0.1),
        ("picovoice_empty.wav", 0.45),  # room noise: measured 0.36 at most, on the recording's first frames
    ],
)
def test_no_frame_of_silence_or_noise_is_voiced(name: str, highest: float) -> None:
    probabilities = SileroClassifier().probabilities(frames_of(load(SHARED / "nonspeech" / name)))
    assert len(probabilities) >= 256  # 8 s or more
    assert float(probabilities.max()) < highest  # so no frame reaches the 0.5 threshold


def test_a_missing_package_is_a_config_error_with_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    assert model_path().is_file()
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ConfigError, match=r"streamer\[silero\]"):
        model_path()


def test_importing_the_backend_leaves_torch_threads_alone() -> None:
    # the silero_vad package's own import would set torch to one thread for the whole process
    import subprocess
    import sys

    code = (
        "import torch; torch.set_num_threads(2); "
        "from streamer.engine.silero_vad import SileroClassifier; SileroClassifier(); "
        "import sys; print(torch.get_num_threads(), 'silero_vad' in sys.modules)"
    )
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=root)
    assert out.stdout.split() == ["2", "False"]
