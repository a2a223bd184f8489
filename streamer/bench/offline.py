"""``streamer bench offline``: streamer's engine against faster-whisper on the same tiny.en weights, same threads,
beam 1, interleaved file by file in one run; prints WER for each and the real-time-factor ratio."""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path

from streamer.errors import ConfigError

__all__ = ["configure_parser", "run"]

DEFAULT_TSV = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "librispeech" / "transcripts.tsv"


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tsv", type=Path, default=DEFAULT_TSV, help="audio<TAB>reference list (default: LibriSpeech)")
    parser.add_argument("--model", default="tiny.en", help="bundled CTranslate2 model both engines load")
    parser.add_argument("--threads", type=int, default=2, help="threads for both engines")
    parser.add_argument("--limit", type=int, default=0, help="only the first N files")
    parser.add_argument("--config", default="default", help="streamer engine configuration (see streamer eval)")
    parser.add_argument("--compute-type", default="int8", help="faster-whisper compute type (int8, float32)")


def run(args: argparse.Namespace) -> int:
    try:
        from faster_whisper import WhisperModel
    except ImportError:
        raise ConfigError("this benchmark needs faster-whisper: pip install 'streamer[bench]'") from None
    from streamer.audiofile import load_audio
    from streamer.engine import CONFIGS, DecodeOptions, load_engine
    from streamer.engine.models import resolve
    from streamer.evaluate import read_dataset
    from streamer.normalize import normalize_english, word_error_rate
    from streamer.transcribe import TranscribeOptions, transcribe

    if args.config not in CONFIGS:
        raise ConfigError(f"unknown --config {args.config!r}: use one of {', '.join(CONFIGS)}")
    items = read_dataset(args.tsv)
    if args.limit:
        items = items[: args.limit]
    ours = load_engine(args.model, replace(CONFIGS[args.config], threads=args.threads))
    source = resolve(args.model)
    theirs = WhisperModel(str(source.directory), device="cpu", compute_type=args.compute_type, cpu_threads=args.threads)
    # both sides decode whole files without VAD, greedy, so the comparison is engine against engine
    options = TranscribeOptions(decode=DecodeOptions(word_timestamps=False), vad=None)
    refs: list[str] = []
    ours_hyps: list[str] = []
    theirs_hyps: list[str] = []
    ours_time = theirs_time = audio_seconds = 0.0
    for index, item in enumerate(items):
        audio = load_audio(item.path).samples
        audio_seconds += len(audio) / 16000
        refs.append(normalize_english(item.reference))
        # alternate who goes first so neither gets a systematically warmer cache
        order = ("ours", "theirs") if index % 2 == 0 else ("theirs", "ours")
        for who in order:
            start = time.perf_counter()
            if who == "ours":
                text = transcribe(ours, audio, options).text
                ours_time += time.perf_counter() - start
                ours_hyps.append(normalize_english(text))
            else:
                segments, _ = theirs.transcribe(audio, beam_size=1, language="en", vad_filter=False)
                text = " ".join(s.text for s in segments)
                theirs_time += time.perf_counter() - start
                theirs_hyps.append(normalize_english(text))
        print(f"\r{index + 1}/{len(items)} files", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    ours_wer = word_error_rate(refs, ours_hyps).wer * 100
    theirs_wer = word_error_rate(refs, theirs_hyps).wer * 100
    print(f"offline benchmark: {len(items)} files, {audio_seconds:.1f} s of audio, {args.threads} threads, beam 1")
    print(f"{'engine':<34} {'WER %':>7} {'RTF':>8}")
    print(f"{'streamer ' + args.config:<34} {ours_wer:>7.2f} {ours_time / audio_seconds:>8.4f}")
    print(f"{'faster-whisper ' + args.compute_type:<34} {theirs_wer:>7.2f} {theirs_time / audio_seconds:>8.4f}")
    print(f"speed ratio (faster-whisper time / streamer time): {theirs_time / ours_time:.2f}x")
    return 0
