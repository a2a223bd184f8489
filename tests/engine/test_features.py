from __future__ import annotations

import numpy as np
import pytest
import torch

from streamer.core.units import N_FRAMES, N_SAMPLES, SAMPLE_RATE
from streamer.engine.features import encoder_frames, log_mel_spectrogram
from tests.conftest import load_clip


def test_matches_transformers_feature_extractor_on_real_speech() -> None:
    from transformers import WhisperFeatureExtractor

    audio = load_clip("1089-134686-0000.flac")
    expected = WhisperFeatureExtractor(feature_size=80)(audio, sampling_rate=16000, return_tensors="np")
    ours = log_mel_spectrogram([audio])
    assert ours.shape == (1, 80, N_FRAMES)
    assert np.abs(ours[0].numpy() - expected.input_features[0]).max() < 1e-4


@pytest.mark.kernels
def test_batched_windows_are_computed_independently() -> None:
    a = load_clip("1089-134686-0000.flac")
    b = load_clip("1089-134686-0001.flac")
    batch = log_mel_spectrogram([a, b])
    assert np.allclose(batch[1].numpy(), log_mel_spectrogram([b])[0].numpy(), atol=1e-5)
    assert np.allclose(batch[0].numpy(), log_mel_spectrogram([a])[0].numpy(), atol=1e-5)


def test_longer_than_a_window_is_refused() -> None:
    with pytest.raises(ValueError, match="at most"):
        log_mel_spectrogram([np.zeros(N_SAMPLES + 1, dtype=np.float32)])


def _full_stft_reference(audio: np.ndarray) -> np.ndarray:
    """The textbook computation: STFT of the whole zero-padded 30 s window."""
    import torch

    from streamer.core.units import HOP_LENGTH, N_FFT
    from streamer.engine.features import mel_filters

    window = np.zeros(N_SAMPLES, dtype=np.float32)
    window[: len(audio)] = audio
    stft = torch.stft(torch.from_numpy(window), N_FFT, HOP_LENGTH, window=torch.hann_window(N_FFT), return_complex=True)
    log_spec = torch.clamp(mel_filters(80).T @ (stft[..., :-1].abs() ** 2), min=1e-10).log10()
    return ((torch.maximum(log_spec, log_spec.max() - 8.0) + 4.0) / 4.0).numpy()


@pytest.mark.parametrize("seconds", [0.0, 0.01, 1.0, 7.3, 29.99, 30.0])
def test_skipping_the_silent_frames_changes_nothing(seconds: float) -> None:
    speech = np.tile(load_clip("1089-134686-0000.flac"), 3)
    audio = speech[: int(seconds * 16000)]
    assert np.abs(log_mel_spectrogram([audio])[0].numpy() - _full_stft_reference(audio)).max() < 1e-5


def test_frames_touched_counts_the_frames_that_see_audio() -> None:
    from streamer.engine.features import frames_touched

    assert frames_touched(0) == 2  # the centre frames around sample 0 see the reflected padding only
    assert frames_touched(16000) == 102
    assert frames_touched(N_SAMPLES) == N_FRAMES


def test_encoder_frames_cover_the_audio_and_its_silence_in_whole_seconds() -> None:
    assert encoder_frames(5 * SAMPLE_RATE, None) == N_FRAMES  # Whisper's whole 30 s
    assert encoder_frames(5 * SAMPLE_RATE, 6.0) == 1100  # 11 s of 10 ms frames
    assert encoder_frames(5 * SAMPLE_RATE + 1, 6.0) == 1200  # rounded up to whole seconds
    assert encoder_frames(0, 3.0) == 300
    assert encoder_frames(N_SAMPLES, 3.0) == N_FRAMES  # never past the 30 s the positions cover
    assert encoder_frames(25 * SAMPLE_RATE, 10.0) == N_FRAMES


@pytest.mark.kernels
def test_incremental_features_of_a_growing_window_equal_the_full_computation() -> None:
    from streamer.engine.features import IncrementalFeatures
    from streamer.engine.types import StreamId

    speech = np.concatenate([load_clip("1089-134686-0000.flac"), load_clip("1089-134686-0001.flac")])
    features = IncrementalFeatures()
    stream = StreamId("a")
    for end in range(16000, len(speech), 12345):
        ours = features.compute([(stream, 0, speech[:end]), (None, 0, speech[:end])])
        expected = log_mel_spectrogram([speech[:end]])[0].numpy()
        assert np.abs(ours[0].numpy() - expected).max() < 1e-5
        assert np.abs(ours[1].numpy() - expected).max() < 1e-5
    assert features.frames_reused > features.frames_computed / 2  # most frames came from the previous window


def test_incremental_features_recompute_when_the_window_start_moves() -> None:
    from streamer.engine.features import IncrementalFeatures
    from streamer.engine.types import StreamId

    speech = load_clip("1089-134686-0000.flac")
    features = IncrementalFeatures()
    stream = StreamId("a")
    features.compute([(stream, 0, speech[:48000])])
    reused = features.frames_reused
    moved = features.compute([(stream, 8000, speech[8000:64000])])  # a trimmed window: every frame moves
    assert features.frames_reused == reused
    assert np.abs(moved[0].numpy() - log_mel_spectrogram([speech[8000:64000]])[0].numpy()).max() < 1e-5
    features.forget(stream)
    assert len(features) == 0


def test_incremental_features_check_the_audio_they_reuse() -> None:
    from streamer.engine.features import IncrementalFeatures
    from streamer.engine.types import StreamId

    speech = load_clip("1089-134686-0000.flac")
    features = IncrementalFeatures()
    features.compute([(StreamId("a"), 0, speech[:48000])])
    other = speech[::-1].copy()[:64000]  # different audio under the same stream id and offset
    ours = features.compute([(StreamId("a"), 0, other)])
    assert np.abs(ours[0].numpy() - log_mel_spectrogram([other])[0].numpy()).max() < 1e-5


def test_incremental_features_notice_one_changed_sample_in_what_they_reuse() -> None:
    from streamer.engine.features import IncrementalFeatures
    from streamer.engine.types import StreamId

    speech = load_clip("1089-134686-0000.flac")
    features = IncrementalFeatures()
    features.compute([(StreamId("a"), 0, speech[:48000])])
    reused = features.frames_reused
    changed = speech[:64000].copy()
    changed[1000] += 0.25  # inside the frames the first window completed
    ours = features.compute([(StreamId("a"), 0, changed)])
    assert features.frames_reused == reused  # nothing reused
    assert np.abs(ours[0].numpy() - log_mel_spectrogram([changed])[0].numpy()).max() < 1e-5


def test_a_batch_checks_its_streams_prefixes_together_as_one_at_a_time_would() -> None:
    # several streams in one batch have their shared audio checked on several threads at once: the same features,
    # the same frames reused, and a changed sample or a stream twice in one batch still handled
    from streamer.engine.features import IncrementalFeatures
    from streamer.engine.types import StreamId

    speech = np.concatenate([load_clip("1089-134686-0000.flac"), load_clip("1089-134686-0001.flac")])
    a, b, c = StreamId("a"), StreamId("b"), StreamId("c")
    features = IncrementalFeatures()
    features.compute([(a, 0, speech[:40000]), (b, 16000, speech[16000:56000]), (c, 0, speech[:30000])])
    reused = features.frames_reused
    changed = speech[:60000].copy()
    changed[500] += 0.25  # inside what c's first window completed
    windows = [
        (a, 0, speech[:70000]),
        (b, 16000, speech[16000:80000]),
        (c, 0, changed),
        (a, 0, speech[:90000]),  # a again, after its window above in the same batch
        (None, 0, speech[:20000]),
    ]
    ours = features.compute(windows)
    for index, (_, _, samples) in enumerate(windows):
        assert np.abs(ours[index].numpy() - log_mel_spectrogram([samples])[0].numpy()).max() < 1e-5
    # a (twice) and b reused what they shared; c reused nothing of its changed audio
    one_at_a_time = IncrementalFeatures()
    one_at_a_time.compute([(a, 0, speech[:40000]), (b, 16000, speech[16000:56000]), (c, 0, speech[:30000])])
    for window in windows:
        one_at_a_time.compute([window])
    assert features.frames_reused - reused == one_at_a_time.frames_reused - reused > 0
    features.close()
    assert np.abs(features.compute(windows[:2])[0].numpy() - ours[0].numpy()).max() < 1e-5  # usable after close


def test_a_stream_is_remembered_by_its_frames_and_a_digest_not_its_audio() -> None:
    from streamer.engine.features import IncrementalFeatures
    from streamer.engine.types import StreamId

    speech = np.concatenate([load_clip("1089-134686-0000.flac")] * 3)[:N_SAMPLES]
    features = IncrementalFeatures()
    features.compute([(StreamId("a"), 0, speech)])
    record = features._streams[StreamId("a")]
    held = [value for value in vars(record).values() if isinstance(value, np.ndarray | torch.Tensor)]
    assert held == [record.log_spec]  # 30 s of audio would be 1.9 MB more per stream


@pytest.mark.parametrize("n_mels", [80, 128])
def test_mel_filters_equal_transformers(n_mels: int) -> None:
    from transformers.audio_utils import mel_filter_bank

    from streamer.engine.features import mel_filters

    expected = mel_filter_bank(
        num_frequency_bins=201,
        num_mel_filters=n_mels,
        min_frequency=0.0,
        max_frequency=8000.0,
        sampling_rate=16000,
        norm="slaney",
        mel_scale="slaney",
    )
    assert np.allclose(mel_filters(n_mels).numpy(), expected.astype(np.float32), rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("frames", [N_FRAMES, 1800, 100, 1])
def test_a_batch_on_the_device_equals_the_host_features_of_each_window(frames: int) -> None:
    from streamer.engine.features import batch_log_mel

    speech = np.tile(load_clip("1089-134686-0000.flac"), 3)
    lengths = [0, 1, 16000, 117_000, N_SAMPLES - 1, N_SAMPLES]  # empty, a sample, 1 s, 7.3 s, up to the 30 s edge
    audio = [speech[:n] for n in lengths]
    ours = batch_log_mel(audio, frames, torch.device("cpu"))
    assert ours.shape == (len(audio), 80, frames)
    for index, samples in enumerate(audio):
        # the clamp's peak over the whole window, even where the frames kept are fewer than those that see audio
        expected = log_mel_spectrogram([samples])[0, :, :frames]
        assert np.abs(ours[index].numpy() - expected.numpy()).max() < 1e-5, lengths[index]


def test_a_device_batch_keeps_each_windows_own_clamp() -> None:
    from streamer.engine.features import batch_log_mel

    loud = load_clip("1089-134686-0000.flac")[:32000]
    quiet = 1e-3 * load_clip("1089-134686-0001.flac")[:48000]
    ours = batch_log_mel([loud, quiet], 500, torch.device("cpu"))
    for index, samples in enumerate((loud, quiet)):
        expected = log_mel_spectrogram([samples])[0, :, :500]
        assert np.abs(ours[index].numpy() - expected.numpy()).max() < 1e-5
    # the windows' peaks differ by much: one clamp for the whole batch would have moved the quiet one's floor
    assert float(ours[0].max() - ours[1].max()) > 1.0


def test_a_device_batch_refuses_what_the_host_refuses() -> None:
    from streamer.engine.features import batch_log_mel

    with pytest.raises(ValueError, match="at most"):
        batch_log_mel([np.zeros(N_SAMPLES + 1, dtype=np.float32)], 100, torch.device("cpu"))
    with pytest.raises(ValueError, match="frames"):
        batch_log_mel([np.zeros(10, dtype=np.float32)], 0, torch.device("cpu"))
    with pytest.raises(ValueError, match="frames"):
        batch_log_mel([np.zeros(10, dtype=np.float32)], N_FRAMES + 1, torch.device("cpu"))
