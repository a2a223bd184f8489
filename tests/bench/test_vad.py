from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import numpy as np
import numpy.typing as npt
import soundfile as sf

from streamer.bench import vad as bench
from streamer.bench.vad import CONTENDERS, Piece, Tally, TimedClassifier, label
from streamer.core.vad import VadOptions, make_classifier

SR = 16000
CLIP = Path(__file__).parent.parent / "data" / "1089-134686-0001.flac"


def clip() -> npt.NDArray[np.float32]:
    x, rate = sf.read(CLIP, dtype="float32")
    assert rate == SR
    return np.asarray(x, dtype=np.float32)


def test_the_timed_classifier_answers_as_the_one_it_wraps() -> None:
    frames = clip()[: 100 * 480].reshape(100, 480)
    timed = TimedClassifier(make_classifier(VadOptions()))
    assert timed.frame_samples == 480
    assert np.array_equal(timed.classify(frames), make_classifier(VadOptions()).classify(frames))
    assert timed.seconds > 0


def test_recall_and_rejection_count_samples_against_the_reference() -> None:
    x = clip()
    silence = np.zeros(2 * SR, dtype=np.float32)
    audio = np.concatenate([silence, x])
    reference = np.concatenate([np.zeros(len(silence), np.bool_), np.ones(len(x), np.bool_)])
    piece = Piece("silence then speech", "librispeech", audio, reference)
    labelled, classifier, detector = label(piece, VadOptions(), 320)
    assert labelled.shape == reference.shape and 0 < classifier <= detector
    tally = Tally()
    tally.add(piece, labelled, classifier, detector)
    assert tally.recall == float((labelled & reference).sum() / reference.sum())
    assert tally.recall is not None and tally.recall > 0.8
    assert tally.rejection is not None and tally.rejection > 0.8  # the padding before speech is the only loss
    assert tally.per_stream_hour(1.0) == 3600 / (len(audio) / SR)


def test_the_bench_writes_every_contender_side_by_side(tmp_path: Path) -> None:
    data = tmp_path / "data"
    speech = data / "librispeech" / "test-clean" / "1089" / "134686"
    speech.mkdir(parents=True)
    shutil.copy(CLIP, speech / CLIP.name)
    (data / "nonspeech").mkdir()
    sf.write(data / "nonspeech" / "silence.wav", np.zeros(3 * SR, dtype=np.float32), SR)
    args = argparse.Namespace(data=data, minutes=0.5, kinds=None, first_seed=0, chunk_ms=20, docs=tmp_path / "docs")
    assert bench.run(args) == 0
    markdown = (tmp_path / "docs" / "benchmarks.md").read_text()
    assert "## vad" in markdown and all(f"| {name} " in markdown for name in CONTENDERS)
    figures = json.loads((tmp_path / "docs" / "benchmarks" / "vad.json").read_text())
    assert set(figures["contenders"]) == set(CONTENDERS)
    for contender in figures["contenders"].values():
        assert contender["speech_recall"] > 0.8
        assert contender["nonspeech_rejection"] > 0.5
        assert contender["detector_cpu_seconds_per_stream_hour"] > 0
