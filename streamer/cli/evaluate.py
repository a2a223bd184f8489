"""``streamer eval``: word error rate and speed over a TSV data set for each engine configuration asked for
(:mod:`streamer.offline.evaluate`), one table row per configuration."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING

from streamer.core.errors import AudioFileError, ConfigError
from streamer.offline.evaluate import (
    DEFAULT_CONFIG,
    NORMALIZERS,
    ConfigScore,
    evaluate,
    format_table,
    read_dataset,
    scores_json,
)

if TYPE_CHECKING:
    from streamer.engine import EngineOptions

__all__ = ["configure_parser", "run"]


def _config_names() -> list[str]:
    from streamer.engine import CONFIGS

    return list(CONFIGS)


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("dataset", metavar="DATASET.tsv", help="TSV of path<TAB>reference, paths relative to it")
    parser.add_argument("--model", default="tiny.en", help="model name or directory (default: tiny.en)")
    parser.add_argument(
        "--config",
        action="append",
        metavar="NAME",
        help=f"engine configuration, repeatable: {', '.join(_config_names())} (default: {DEFAULT_CONFIG})",
    )
    parser.add_argument("--limit", type=int, metavar="N", help="only the first N files of the data set")
    parser.add_argument(
        "--normalizer", choices=list(NORMALIZERS), default="english", help="text normaliser (basic for non-English)"
    )
    parser.add_argument("--json", metavar="OUT", help="also write the figures, per file too, to this JSON file")


def _engine_options(name: str) -> EngineOptions:
    from streamer.engine import CONFIGS, EngineOptions

    if name == DEFAULT_CONFIG:
        return EngineOptions()
    if name not in CONFIGS:
        raise ConfigError(f"unknown --config {name!r}; choose from {', '.join(_config_names())}")
    return CONFIGS[name]


def _needs_cuda(options: EngineOptions) -> bool:
    devices = (options.encoder_device, options.decoder_device)
    return any(device is not None and device.startswith("cuda") for device in devices)


def run(args: argparse.Namespace) -> int:
    import sys

    from streamer.engine import cuda_available, load_engine
    from streamer.offline.audiofile import load_audio

    # 1. Check the arguments and read the data set before loading any model.
    configs = args.config or [DEFAULT_CONFIG]
    engine_options = {name: _engine_options(name) for name in configs}
    if args.limit is not None and args.limit < 1:
        raise ConfigError("--limit must be at least 1")
    dataset = Path(args.dataset)
    items = read_dataset(dataset, limit=args.limit)
    # 2. Decode every file once for all configurations; a bad file is reported and left out of every row.
    loaded = []
    for item in items:
        try:
            loaded.append((item, load_audio(item.path)))
        except AudioFileError as error:
            print(f"streamer: error: {error} (left out)", file=sys.stderr)
    if not loaded:
        raise AudioFileError(f"{dataset}: no readable audio files")
    # 3. One engine at a time: load, score the whole set, release.
    scores = []
    for name, options in engine_options.items():
        if _needs_cuda(options) and not cuda_available():
            scores.append(ConfigScore(name, skipped="needs a CUDA GPU"))
            continue
        try:
            engine = load_engine(args.model, options)
        except ConfigError as error:
            scores.append(ConfigScore(name, skipped=str(error)))
            continue
        try:
            scores.append(evaluate(engine, loaded, config=name, normalizer=NORMALIZERS[args.normalizer]))
        finally:
            engine.close()
    # 4. Report.
    sys.stdout.write(format_table(scores))
    if args.json:
        Path(args.json).write_text(json.dumps(scores_json(dataset, args.model, scores), indent=2) + "\n")
    return 0
