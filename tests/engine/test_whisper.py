"""The real tiny.en model on real speech: accuracy, timestamps, options and failure modes."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from streamer.core.errors import ConfigError, InvalidState
from streamer.core.units import N_SAMPLES, SAMPLE_RATE
from streamer.engine import CONFIGS, DecodeOptions, DecodeRequest, EngineOptions, load_engine
from streamer.engine.features import encoder_frames
from streamer.engine.kernels import bf16_linear_runs, kernel_report
from streamer.engine.types import Engine, Task
from streamer.engine.whisper import WhisperEngine, split_segments
from streamer.offline.normalize import normalize_english, word_error_rate
from streamer.offline.transcribe import OFFLINE_ENCODER_PAD_SECONDS
from tests.conftest import CLIPS, load_clip

pytestmark = pytest.mark.model


def _wer(engine: Engine, name: str, options: DecodeOptions | None = None) -> float:
    result = engine.decode([DecodeRequest(audio=load_clip(name), options=options or DecodeOptions())])[0]
    return word_error_rate([normalize_english(CLIPS[name])], [normalize_english(result.text)]).wer


def test_transcribes_real_speech_accurately(tiny_engine: WhisperEngine) -> None:
    assert isinstance(tiny_engine, Engine)
    # the CPU default: what this CPU's kernel class calls for (tests/engine/test_kernels.py tests the choice)
    assert tiny_engine.info.encoder == f"{kernel_report().default_encoder}/cpu"
    # tiny.en's known slips, which faster-whisper makes too with the same weights: "and thick" for "in thick",
    # "flower fatened" for "flour fattened", "stuffered" for "stuff it"
    assert _wer(tiny_engine, "1089-134686-0000.flac") <= 0.15
    assert _wer(tiny_engine, "1089-134686-0001.flac") <= 0.30


def test_batch_results_equal_single_results_in_request_order(tiny_engine: WhisperEngine) -> None:
    a, b = load_clip("1089-134686-0000.flac"), load_clip("1089-134686-0001.flac")
    batch = tiny_engine.decode([DecodeRequest(audio=a, request_id=1), DecodeRequest(audio=b, request_id=2)])
    assert [r.request_id for r in batch] == [1, 2]
    assert batch[1].text == tiny_engine.decode([DecodeRequest(audio=b)])[0].text
    assert batch[0].timings.encoder > 0 and batch[0].decoder_passes > 5


def test_word_timestamps_are_ordered_and_inside_the_audio(tiny_engine: WhisperEngine) -> None:
    audio = load_clip("1089-134686-0000.flac")
    result = tiny_engine.decode([DecodeRequest(audio=audio)])[0]
    words = result.words
    assert len(words) >= 20
    assert "".join(w.word for w in words).strip() == result.text.strip()
    starts = [w.start for w in words]
    assert starts == sorted(starts)
    assert all(0 <= w.start <= w.end <= len(audio) for w in words)
    assert all(0.0 <= w.probability <= 1.0 for w in words)
    # "sauce" is the last word, spoken in the final second of the clip
    assert words[-1].word.strip(" .").lower() == "sauce"
    assert words[-1].end > len(audio) - 1.5 * SAMPLE_RATE
    # speech starts within the first half second
    assert words[0].start < 0.5 * SAMPLE_RATE
    segments = result.segments
    assert all(s.start <= s.end for s in segments) and segments[-1].end <= len(audio)


def test_a_word_is_placed_where_it_is_spoken(tiny_engine: WhisperEngine) -> None:
    """Splice one second of silence in the middle: the words after it move by a second."""
    audio = load_clip("1089-134686-0001.flac")
    plain = tiny_engine.decode([DecodeRequest(audio=audio)])[0].words
    cut = len(audio) // 2
    spliced = np.concatenate([audio[:cut], np.zeros(SAMPLE_RATE, np.float32), audio[cut:]])
    moved = tiny_engine.decode([DecodeRequest(audio=spliced)])[0].words
    last_plain, last_moved = plain[-1], moved[-1]
    assert last_plain.word == last_moved.word
    assert abs((last_moved.end - last_plain.end) - SAMPLE_RATE) < 0.3 * SAMPLE_RATE


def test_silence_and_noise_are_flagged_as_no_speech(tiny_engine: WhisperEngine) -> None:
    rng = np.random.default_rng(0)
    silence = np.zeros(5 * SAMPLE_RATE, np.float32)
    noise = (0.01 * rng.standard_normal(5 * SAMPLE_RATE)).astype(np.float32)
    # tiny.en's classic slip on empty audio is a lone " you"; the window must at least be flagged as no-speech so
    # the streaming guards and the VAD in front of the engine can drop it
    for audio in (silence, noise):
        result = tiny_engine.decode([DecodeRequest(audio=audio)])[0]
        assert len(result.text.split()) <= 1
        assert result.no_speech_prob > 0.5


def test_beam_search_and_no_timestamps_modes(tiny_engine: WhisperEngine) -> None:
    assert _wer(tiny_engine, "1089-134686-0000.flac", DecodeOptions(beam_size=5)) <= 0.15
    plain = DecodeOptions(without_timestamps=True, word_timestamps=False)
    result = tiny_engine.decode([DecodeRequest(audio=load_clip("1089-134686-0001.flac"), options=plain)])[0]
    assert len(result.segments) == 1 and not result.words
    assert "belly" in result.text.lower()


def test_prompt_conditions_the_spelling(tiny_engine: WhisperEngine) -> None:
    audio = load_clip("1089-134686-0001.flac")
    plain = tiny_engine.decode([DecodeRequest(audio=audio)])[0].text
    british = "The counsellor counselled the colour of the labour."
    prompted = tiny_engine.decode([DecodeRequest(audio=audio, prompt=british)])[0].text
    assert "counseled" in plain.lower()
    assert "counselled" in prompted.lower()


def test_temperature_fallback_is_reported(tiny_engine: WhisperEngine) -> None:
    # an impossible log-prob threshold forces every temperature to be tried; the last one is reported
    options = DecodeOptions(logprob_threshold=10.0, temperatures=(0.0, 0.5), no_speech_threshold=None)
    result = tiny_engine.decode([DecodeRequest(audio=load_clip("1089-134686-0001.flac"), options=options)])[0]
    assert result.temperature == 0.5
    assert result.text


def test_english_only_model_refuses_translation(tiny_engine: WhisperEngine) -> None:
    options = DecodeOptions(task=Task.TRANSLATE)
    with pytest.raises(ConfigError, match="English-only"):
        tiny_engine.decode([DecodeRequest(audio=load_clip("1089-134686-0001.flac"), options=options)])


def test_bad_requests_are_refused() -> None:
    engine = load_engine("tiny.en", EngineOptions(warmup=False))
    with pytest.raises(ValueError, match="at most 30 s"):
        engine.decode([DecodeRequest(audio=np.zeros(N_SAMPLES + 1, np.float32))])
    with pytest.raises(ConfigError, match="beam_size"):
        engine.decode([DecodeRequest(audio=np.zeros(100, np.float32), options=DecodeOptions(beam_size=0))])
    engine.close()
    with pytest.raises(InvalidState):
        engine.decode([DecodeRequest(audio=np.zeros(100, np.float32))])


# The accuracy set: every LibriSpeech test-clean utterance and the first four test-other utterances of each of the
# five test-other speakers in ../shared/data (36 utterances, 293 s, 766 reference words). A precision must stay within
# ACCURACY_MARGIN of fp32's WER on the same set. Measured with `streamer eval` on an AMD EPYC (AVX512-BF16, no AMX)
# natively, with ATEN_CPU_CAPABILITY=default and =avx2, and with ONEDNN_MAX_CPU_ISA=AVX2: fp32 8.68% under all four,
# every other configuration between 8.03% and 9.33%, so within 0.65 points of fp32. The margin is over twice that
# (11 words), while the two words that decided the old one-clip test are 0.26 points here.
ACCURACY_MARGIN = 0.015
FP32_WER_LIMIT = 0.10  # tiny.en's published LibriSpeech WER is 5.6% test-clean, 14.9% test-other (greedy)


def _accuracy_set(shared: Path) -> list[tuple[str, str]]:
    lines = (shared / "librispeech" / "transcripts.tsv").read_text(encoding="utf-8").splitlines()[1:]
    items = [tuple(line.split("\t", 1)) for line in lines if "\t" in line]
    clean = [(path, text) for path, text in items if path.startswith("test-clean/")]
    other = [
        (path, text)
        for speaker in ("533", "1688", "2414", "3005", "3331")
        for path, text in [i for i in items if i[0].startswith(f"test-other/{speaker}/")][:4]
    ]
    return clean + other


def _set_wer(engine: Engine, shared: Path, pad: float | None = OFFLINE_ENCODER_PAD_SECONDS) -> float:
    import soundfile as sf

    from streamer.offline.transcribe import TranscribeOptions, transcribe

    options = TranscribeOptions()
    options = replace(options, decode=replace(options.decode, encoder_pad_seconds=pad))

    references, hypotheses = [], []
    for path, text in _accuracy_set(shared):
        audio, rate = sf.read(shared / "librispeech" / path, dtype="float32")
        assert rate == SAMPLE_RATE
        references.append(normalize_english(text))
        hypotheses.append(normalize_english(transcribe(engine, audio, options).text))
    return word_error_rate(references, hypotheses).wer


@pytest.fixture(scope="module")
def fp32_set_wer(shared_data: Path) -> float:
    engine = load_engine("tiny.en", replace(CONFIGS["fp32"], warmup=False))
    assert engine.info.encoder == "fp32/cpu"
    return _set_wer(engine, shared_data)


@pytest.mark.kernels
def test_fp32_is_accurate_on_the_accuracy_set(fp32_set_wer: float) -> None:
    assert fp32_set_wer <= FP32_WER_LIMIT


@pytest.mark.kernels
@pytest.mark.parametrize("config", ["default", "int8-encoder", "int8-decoder", "int8", "bf16-encoder", "bf16"])
def test_reduced_precisions_are_as_accurate_as_fp32(config: str, shared_data: Path, fp32_set_wer: float) -> None:
    """Each precision against the references, within a margin of fp32 on the same 36 utterances: a property of
    the product, which no kernel path may break (two words flipping between kernels is 0.26 points here). Where
    this CPU's kernels cannot run bf16 (oneDNN capped below it), asking for it is refused clearly instead."""
    options = replace(CONFIGS[config], warmup=False)
    if "bf16" in config and not bf16_linear_runs():
        with pytest.raises(ConfigError, match="bf16 kernels do not run"):
            load_engine("tiny.en", options)
        return
    wer = _set_wer(load_engine("tiny.en", options), shared_data)
    assert wer <= fp32_set_wer + ACCURACY_MARGIN, f"{config} {wer:.2%} against fp32 {fp32_set_wer:.2%}"


@pytest.fixture(scope="module")
def fp32_whole_window_wer(shared_data: Path) -> float:
    """fp32 over Whisper's whole 30 s window: 1.2 points worse than over the audio and 6 s of silence on this set."""
    engine = load_engine("tiny.en", replace(CONFIGS["fp32"], warmup=False))
    return _set_wer(engine, shared_data, None)


@pytest.mark.kernels
@pytest.mark.parametrize("config", ["default", "int8-encoder"])
@pytest.mark.parametrize("pad", [None, 3.0, 10.0])
def test_an_encoder_reading_the_audio_and_its_silence_is_as_accurate(
    pad: float | None, config: str, shared_data: Path, fp32_set_wer: float, fp32_whole_window_wer: float
) -> None:
    """The encoder over each window's audio and ``pad`` seconds of the silence after it (offline's default is 6 s):
    the same 36 utterances as accurately as fp32 does by default, the least padding allowed included. Over the whole
    30 s (None), as accurately as fp32 over the whole 30 s: reading Whisper's whole window costs fp32 itself 1.2
    points here, which is the span's cost, not the precision's. The default encoder and the INT8 one each (the
    default is bf16 on a CPU with bf16 kernels, INT8 below: a native run covers INT8 too)."""
    engine = load_engine("tiny.en", replace(CONFIGS[config], warmup=False))
    wer = _set_wer(engine, shared_data, pad)
    reference = fp32_whole_window_wer if pad is None else fp32_set_wer
    assert wer <= reference + ACCURACY_MARGIN, f"{config}, pad {pad} s: {wer:.2%} against fp32 {reference:.2%}"


def test_each_window_of_a_batch_is_encoded_over_its_own_span_on_the_cpu(
    tiny_engine: WhisperEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On the CPU the encoder takes a batch's windows one at a time, each over its own span (its audio and the
    silence it asked for); the decoder masks the shorter ones' padding. Before, every window was encoded over the
    batch's longest span."""
    spans: list[list[int]] = []
    encode = tiny_engine.runtime.encode

    def spying(features: Any, frames: Any = None) -> Any:
        spans.append(list(frames) if frames is not None else [features.shape[-1]] * features.shape[0])
        return encode(features, frames)

    monkeypatch.setattr(tiny_engine.runtime, "encode", spying)
    audio = load_clip("1089-134686-0000.flac")[: 5 * SAMPLE_RATE]
    short, whole = DecodeOptions(encoder_pad_seconds=3.0), DecodeOptions()
    results = tiny_engine.decode([DecodeRequest(audio=audio, options=short)])
    results += tiny_engine.decode([DecodeRequest(audio=audio, options=short), DecodeRequest(audio, whole)])
    results += tiny_engine.decode([DecodeRequest(audio=audio, options=whole)])
    assert spans == [[800], [800, N_SAMPLES // 160], [N_SAMPLES // 160]]  # 5 s and 3 s of silence; 30 s
    assert all(len(r.text.split()) >= 10 for r in results)  # every one read the speech
    assert results[1].tokens == results[0].tokens and results[2].tokens == results[3].tokens


@pytest.mark.kernels
def test_windows_of_different_lengths_decode_in_a_batch_as_they_do_alone(tiny_engine: WhisperEngine) -> None:
    """A window's transcript and word timings do not depend on what it is batched with: each is encoded over its
    own span and attends only to it. (Encoded over the batch's longest span, three of these four windows changed
    in the batch, one losing its last four words.)"""
    clips = [load_clip(name) for name in ("1089-134686-0000.flac", "1089-134686-0001.flac", "121-127105-0000.flac")]
    options = DecodeOptions(temperatures=(0.0,), encoder_pad_seconds=10.0)
    windows = [clips[0][: 2 * SAMPLE_RATE], clips[1], clips[2][: 11 * SAMPLE_RATE], clips[0][SAMPLE_RATE:]]
    requests = [DecodeRequest(audio=w, options=options, request_id=i) for i, w in enumerate(windows)]
    alone = [tiny_engine.decode([r])[0] for r in requests]
    together = tiny_engine.decode(requests)
    assert len({encoder_frames(len(w), 10.0) for w in windows}) == 3
    assert [r.tokens for r in together] == [r.tokens for r in alone]
    spans = [[(w.word, w.start, w.end) for w in r.words] for r in together]
    assert spans == [[(w.word, w.start, w.end) for w in r.words] for r in alone]
    probabilities = [w.probability for r in together for w in r.words]
    assert probabilities == pytest.approx([w.probability for r in alone for w in r.words], abs=1e-3)
    assert all(len(r.words) >= 3 for r in alone)


def test_features_computed_on_the_encoders_device_give_the_same_transcripts(
    tiny_engine: WhisperEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A GPU's path (on for an encoder on CUDA), forced here on the CPU: the batch's log-mel in one batched STFT
    where the encoder runs, not the host's frames reused from each stream's previous window."""
    import torch

    import streamer.engine.whisper as whisper_module

    calls: list[int] = []
    batch_log_mel = whisper_module.batch_log_mel
    monkeypatch.setattr(whisper_module, "batch_log_mel", lambda a, *r: (calls.append(len(a)), batch_log_mel(a, *r))[1])
    on_device = load_engine("tiny.en", EngineOptions(features_on_device=True, warmup=False))
    encoded: dict[str, list[torch.Tensor]] = {"device": [], "host": []}
    for name, engine in (("device", on_device), ("host", tiny_engine)):
        encode = engine.runtime.encode
        monkeypatch.setattr(
            engine.runtime, "encode", lambda f, s=None, e=encode, n=name: (encoded[n].append(f), e(f, s))[1]
        )
    clips = [
        load_clip(name)[:length]
        for name, length in (("1089-134686-0000.flac", None), ("1089-134686-0001.flac", 80_000))
    ]
    requests = [DecodeRequest(audio=clip, stream_id=index, stream_offset=0) for index, clip in enumerate(clips)]
    texts = {"device": on_device.decode(requests), "host": tiny_engine.decode(requests)}
    assert calls == [2]  # the default engine on the CPU computed its features on the host
    # the encoder read the same features either way (to float rounding) ...
    [device], [host] = encoded["device"], encoded["host"]
    assert device.shape == host.shape and torch.allclose(device, host, atol=1e-5)
    # ... and wrote the same words (a token flipped by that rounding would be allowed, not a changed transcript)
    for ours, theirs in zip(texts["device"], texts["host"], strict=True):
        assert word_error_rate([normalize_english(theirs.text)], [normalize_english(ours.text)]).wer <= 0.05
    on_device.close()
    for index in range(len(clips)):
        tiny_engine.forget_stream(index)


def test_cuda_configurations_are_refused_clearly_without_a_gpu() -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(ConfigError, match="no CUDA device"):
        load_engine("tiny.en", CONFIGS["fp16"])


def test_on_a_machine_with_a_gpu_unplaced_components_go_to_it_and_cpu_ones_take_the_cpu_defaults(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Found by bench/gpu.sh on an H200 host: a configuration that put both components on the CPU got the GPU's
    default precision (an fp16 encoder on the CPU) because the defaults followed the machine, not the placement."""
    import torch

    import streamer.engine as engine_package

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    monkeypatch.setattr(engine_package, "cuda_available", lambda: True)
    on_the_cpu = load_engine("tiny.en", EngineOptions(encoder_device="cpu", decoder_device="cpu", warmup=False))
    assert on_the_cpu.info.encoder == f"{kernel_report().default_encoder}/cpu"
    assert on_the_cpu.info.decoder == "fp32/cpu"
    # a component left unplaced goes to the GPU (refused here, where torch has none)
    with pytest.raises(ConfigError, match="decoder device 'cuda' asked for"):
        load_engine("tiny.en", EngineOptions(encoder_device="cpu", warmup=False))


def test_invalid_engine_options_name_the_field() -> None:
    from streamer.engine.runtime import Placement, Precision

    with pytest.raises(ConfigError, match="encoder precision"):
        load_engine("tiny.en", EngineOptions(encoder_precision="int4"))
    with pytest.raises(ConfigError, match="device must be"):
        load_engine("tiny.en", EngineOptions(decoder_device="tpu"))
    with pytest.raises(ConfigError, match="int8 runs on the CPU"):
        Placement(Precision.INT8, "cuda:0").validate("encoder")


def test_split_segments_cuts_at_timestamp_pairs() -> None:
    tb = 1000
    tokens = [tb + 0, 1, 2, tb + 50, tb + 50, 3, tb + 100, tb + 100, 4]
    spans = split_segments(tokens, tb, 3 * SAMPLE_RATE)
    assert [(s, e) for s, e, _ in spans] == [(0, 50 * 320), (50 * 320, 100 * 320), (100 * 320, 3 * SAMPLE_RATE)]
    assert [t for _, _, toks in spans for t in toks if t < tb] == [1, 2, 3, 4]
    assert split_segments([tb, 5, tb + 10], tb, SAMPLE_RATE) == [(0, 3200, [tb, 5, tb + 10])]
