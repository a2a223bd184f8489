"""``streamer bench narrowband``: what the telephone does to accuracy.

Each LibriSpeech utterance is transcribed twice by the same engine in one run: as recorded (16 kHz wideband), and
after the trip a call takes through the telephone network: downsampled to 8 kHz (band-limited to 4 kHz), encoded
to G.711 mu-law (or A-law) and decoded, then upsampled back to the model's 16 kHz, as the server does with
``encoding=mulaw&sample_rate=8000``. Prints the pooled normalised WER of both, side by side, and the difference.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import numpy.typing as npt

from streamer.core.audio import decode_alaw, decode_mulaw, encode_alaw, encode_mulaw, resample
from streamer.core.units import SAMPLE_RATE

__all__ = ["configure_parser", "narrowband", "run"]

DEFAULT_TSV = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "librispeech" / "transcripts.tsv"
TELEPHONE_RATE = 8000  # G.711 narrowband


def narrowband(audio: npt.NDArray[np.float32], codec: str = "mulaw") -> npt.NDArray[np.float32]:
    """``audio`` (16 kHz) as it reaches the model after a G.711 call: 8 kHz, companded, back at 16 kHz."""
    narrow = resample(audio, SAMPLE_RATE, TELEPHONE_RATE)
    coded = decode_mulaw(encode_mulaw(narrow)) if codec == "mulaw" else decode_alaw(encode_alaw(narrow))
    return resample(coded, TELEPHONE_RATE, SAMPLE_RATE)


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tsv", type=Path, default=DEFAULT_TSV, help="audio<TAB>reference list (default: LibriSpeech)")
    parser.add_argument("--model", default="tiny.en", help="model name or directory (default: %(default)s)")
    parser.add_argument("--codec", choices=("mulaw", "alaw"), default="mulaw", help="G.711 law (default: mulaw)")
    parser.add_argument("--limit", type=int, default=0, help="only the first N files")


def run(args: argparse.Namespace) -> int:
    from streamer.engine import load_engine
    from streamer.offline.audiofile import load_audio
    from streamer.offline.evaluate import read_dataset
    from streamer.offline.normalize import normalize_english, word_error_rate
    from streamer.offline.transcribe import transcribe

    items = read_dataset(args.tsv, limit=args.limit or None)
    engine = load_engine(args.model)
    refs: list[str] = []
    wide: list[str] = []
    narrow: list[str] = []
    seconds = 0.0
    started = time.perf_counter()
    try:
        for index, item in enumerate(items):
            audio = load_audio(item.path).samples
            seconds += len(audio) / SAMPLE_RATE
            refs.append(normalize_english(item.reference))
            wide.append(normalize_english(transcribe(engine, audio).text))
            narrow.append(normalize_english(transcribe(engine, narrowband(audio, args.codec)).text))
            print(f"\r{index + 1}/{len(items)} files", end="", file=sys.stderr, flush=True)
    finally:
        engine.close()
    print(file=sys.stderr)
    wide_wer = word_error_rate(refs, wide)
    narrow_wer = word_error_rate(refs, narrow)
    print(
        f"narrowband benchmark: {args.model}, {len(items)} files, {seconds:.1f} s of audio, "
        f"{time.perf_counter() - started:.0f} s"
    )
    print(f"{'audio':<36} {'WER %':>7} {'words':>7}")
    print(f"{'wideband 16 kHz':<36} {wide_wer.wer * 100:>7.2f} {wide_wer.words:>7}")
    print(f"{'narrowband 8 kHz G.711 ' + args.codec:<36} {narrow_wer.wer * 100:>7.2f} {narrow_wer.words:>7}")
    print(f"narrowband - wideband: {(narrow_wer.wer - wide_wer.wer) * 100:+.2f} WER points")
    return 0
