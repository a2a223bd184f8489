"""Silero VAD, the neural frame classifier behind ``--vad silero``: one model per process, state per stream.

The network is the one the ``silero-vad`` package ships (MIT, v5/v6 architecture; no download at run time): an STFT,
four convolutions and an LSTM cell over 32 ms frames (512 samples at 16 kHz), each frame preceded by the last
64 samples of the one before. It is run from the package's "sequence" ONNX export, which takes a block of frames in
one call and hands the LSTM state in and out (``h``, ``c``): the probabilities are those of the package's
frame-at-a-time model (tests/engine/test_silero_vad.py checks them against it), at a fraction of the calls.

Why onnxruntime rather than torch, which runs the package's default (TorchScript) model just as exactly: torch runs
the small convolutions in its intra-op thread pool, and on 2 busy cores the thread wake-ups took a 32 ms frame from
0.19 ms of CPU on one thread to 1 to 100 ms on two. torch's thread count is one setting shared with the Whisper
engine, which needs its threads; an onnxruntime session has a pool of its own, here one thread: 0.03 to 0.06 ms a frame
(measured on this project's shared 2-core machine; ``streamer bench vad`` gives the figures per stream-hour).

Why ``import silero_vad`` is avoided: the package's import loads torch and calls ``torch.set_num_threads(1)``, which
every thread started afterwards inherits, the engine's worker included. The model file is found on disk instead.

The core's voice activity detector cannot import this module (issue 38: the core imports nothing from the engine):
whoever makes a stream core or a detector passes :data:`CLASSIFIERS`, which maps ``VadBackend.SILERO`` to
:func:`classifier` (``StreamCore(..., vad_classifiers=CLASSIFIERS)``, ``make_classifier(options, CLASSIFIERS)``).
Importing this module loads nothing: the model is loaded by the first classifier made (or by :func:`load_model`).
"""

from __future__ import annotations

import functools
import importlib.util
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np
import numpy.typing as npt

from streamer.core.errors import ConfigError
from streamer.core.vad import ClassifierFactory, VadBackend, VadOptions

__all__ = [
    "CLASSIFIERS",
    "CONTEXT_SAMPLES",
    "FRAME_SAMPLES",
    "MODEL_FILE",
    "SileroClassifier",
    "SileroModel",
    "classifier",
    "load_model",
    "model_path",
]

FRAME_SAMPLES = 512  # 32 ms at 16 kHz: the only frame the 16 kHz model takes
CONTEXT_SAMPLES = 64  # each frame goes in after the last 64 samples of the frame before it
MODEL_FILE = "silero_vad_16k_sequence.onnx"  # in the package's data/ folder since silero-vad 6.2.3
_STATE_SHAPE = (1, 1, 128)  # the LSTM's h and c
_MAX_FRAMES = 512  # frames per call (16 s of audio): bounds a call's memory whatever the chunk a client sends
_INSTALL = "pip install 'streamer[silero]'"


def model_path() -> Path:
    """The sequence model inside the installed ``silero-vad`` package, found without importing it (see above)."""
    spec = importlib.util.find_spec("silero_vad")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(f"--vad silero needs the silero-vad package: {_INSTALL}")
    path = Path(next(iter(spec.submodule_search_locations))) / "data" / MODEL_FILE
    if not path.is_file():
        raise ConfigError(f"the installed silero-vad lacks data/{MODEL_FILE} (6.2.3 or later has it): {_INSTALL}")
    return path


class SileroModel:
    """The loaded network, shared by every stream of the process (an onnxruntime session may be run from several
    threads at once). Stateless itself: :meth:`run` takes a stream's state and returns the next one."""

    def __init__(self, path: Path) -> None:
        try:
            import onnxruntime
        except ImportError as exc:
            raise ConfigError(f"--vad silero needs onnxruntime: {_INSTALL}") from exc
        options = onnxruntime.SessionOptions()
        # one thread: a frame is a few small products, each too small to share (see the module docstring)
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        self._session: Any = onnxruntime.InferenceSession(
            str(path), sess_options=options, providers=["CPUExecutionProvider"]
        )

    def run(
        self, inputs: npt.NDArray[np.float32], h: npt.NDArray[np.float32], c: npt.NDArray[np.float32]
    ) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.float32], npt.NDArray[np.float32]]:
        """Speech probabilities of ``inputs`` (``(n, CONTEXT_SAMPLES + FRAME_SAMPLES)``: consecutive frames of one
        stream, each after its context), from LSTM state ``h``, ``c``; returns them with the state after the last."""
        probs, h, c = self._session.run(["speech_probs", "hn", "cn"], {"input": inputs, "h": h, "c": c})
        return np.asarray(probs, dtype=np.float32).reshape(-1), h, c


@functools.cache
def load_model() -> SileroModel:
    """The process's one :class:`SileroModel`, loaded on the first call (milliseconds; the server calls it at start-up
    with ``--vad silero`` so a missing package fails there, not in the first stream)."""
    return SileroModel(model_path())


class SileroClassifier:
    """One stream's Silero frame classifier (a :class:`~streamer.core.vad.FrameClassifier`): frames are voiced when
    their speech probability is at least ``threshold``. Holds the stream's recurrent state: one per stream."""

    frame_samples = FRAME_SAMPLES

    def __init__(self, threshold: float = 0.5, model: SileroModel | None = None) -> None:
        self.threshold = threshold
        self._model = model if model is not None else load_model()
        self._h = np.zeros(_STATE_SHAPE, dtype=np.float32)
        self._c = np.zeros(_STATE_SHAPE, dtype=np.float32)
        self._context = np.zeros(CONTEXT_SAMPLES, dtype=np.float32)  # a stream starts after silence

    def probabilities(self, frames: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        """The stream's next frames, ``(n, FRAME_SAMPLES)``: the speech probability of each, in order."""
        frames = np.asarray(frames, dtype=np.float32).reshape(-1, FRAME_SAMPLES)
        out = np.empty(len(frames), dtype=np.float32)
        for first in range(0, len(frames), _MAX_FRAMES):
            block = frames[first : first + _MAX_FRAMES]
            contexts = np.concatenate([self._context[None, :], block[:-1, -CONTEXT_SAMPLES:]])
            inputs = np.ascontiguousarray(np.concatenate([contexts, block], axis=1))
            out[first : first + len(block)], self._h, self._c = self._model.run(inputs, self._h, self._c)
            self._context = block[-1, -CONTEXT_SAMPLES:].copy()
        return out

    def classify(self, frames: npt.NDArray[np.float32]) -> npt.NDArray[np.bool_]:
        return self.probabilities(frames) >= self.threshold


def classifier(options: VadOptions) -> SileroClassifier:
    """One stream's classifier for ``--vad silero`` (a :data:`~streamer.core.vad.ClassifierFactory`): the process's
    model, voiced at ``options.silero_threshold``."""
    return SileroClassifier(options.silero_threshold)


# the model-backed frame classifiers this package gives the core's voice activity detector, by backend: what every
# runner passes as StreamCore's vad_classifiers (or to streamer.core.vad.make_classifier)
CLASSIFIERS: Mapping[VadBackend, ClassifierFactory] = MappingProxyType({VadBackend.SILERO: classifier})
