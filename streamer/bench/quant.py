"""``streamer bench quant``: the seed experiment's precision table on real speech.

For each engine configuration (fp32, INT8 encoder, FP16 decoder on the GPU, INT8 encoder + FP16 decoder by default)
a fresh process loads the model and transcribes the same LibriSpeech utterances with
:func:`streamer.offline.evaluate.evaluate`; it reports pooled normalised WER, real-time factor and its peak resident
memory (``VmHWM``), so one configuration's peak never mixes with another's. Configurations that need CUDA are skipped
with a note on machines without it. Speed is also given relative to the first configuration run (fp32 by default),
measured in the same benchmark run, one configuration after the other.
"""

from __future__ import annotations

import argparse
import sys
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from multiprocessing import get_context
from pathlib import Path

from streamer.bench.harness import DATA
from streamer.bench.report import Report, add_docs_argument, command_line, format_table, machine_note, write_report
from streamer.core.errors import ConfigError

__all__ = ["SEED_CONFIGS", "QuantRow", "QuantSpec", "configure_parser", "measure", "peak_rss_mib", "run"]

SEED_CONFIGS = ("fp32", "int8-encoder", "bf16-encoder", "bf16", "int8", "fp16-decoder", "int8-encoder+fp16-decoder")
LIBRISPEECH_TSV = DATA / "librispeech" / "transcripts.tsv"


@dataclass(frozen=True)
class QuantSpec:
    """What one worker process measures."""

    config: str
    model: str
    tsv: Path
    limit: int
    fake: bool = False  # the scripted engine (no model): exercises the mechanics only
    threads: int | None = None


@dataclass(frozen=True)
class QuantRow:
    """One configuration's figures, or why it was skipped."""

    config: str
    files: int = 0
    audio_seconds: float = 0.0
    busy_seconds: float = 0.0
    wer: float | None = None  # percent, pooled and normalised
    peak_rss_mib: float | None = None  # peak resident memory of the process that ran it
    base_rss_mib: float | None = None  # resident memory after imports, before the model loaded
    skipped: str | None = None

    @property
    def rtf(self) -> float | None:
        return self.busy_seconds / self.audio_seconds if self.audio_seconds else None


def peak_rss_mib() -> float:
    """This process's peak resident set size in MiB: ``VmHWM`` from /proc, else ``getrusage``."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 1024 if sys.platform != "darwin" else peak / (1 << 20)  # KiB on Linux, bytes on macOS


def measure(spec: QuantSpec) -> QuantRow:
    """Load the engine of ``spec`` and score it over the data set; run in a fresh process (peak RSS is per process)."""
    from streamer.engine import CONFIGS, cuda_available, load_engine
    from streamer.engine.fake import ScriptedEngine
    from streamer.engine.types import Engine
    from streamer.offline.audiofile import load_audio
    from streamer.offline.evaluate import evaluate, read_dataset

    options = replace(CONFIGS[spec.config], threads=spec.threads)
    if "cuda" in (options.encoder_device, options.decoder_device) and not cuda_available():
        return QuantRow(spec.config, skipped="needs a CUDA GPU; there is none here")
    items = read_dataset(spec.tsv, limit=spec.limit)
    loaded = [(item, load_audio(item.path)) for item in items]
    base = peak_rss_mib()
    engine: Engine = ScriptedEngine(()) if spec.fake else load_engine(spec.model, options)
    try:
        score = evaluate(engine, loaded, config=spec.config)
    finally:
        engine.close()
    return QuantRow(
        spec.config,
        files=len(score.files),
        audio_seconds=score.audio_seconds,
        busy_seconds=score.busy_seconds,
        wer=score.wer.wer * 100,
        peak_rss_mib=peak_rss_mib(),
        base_rss_mib=base,
    )


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config", action="append", help=f"engine configuration, repeatable (default: {', '.join(SEED_CONFIGS)})"
    )
    parser.add_argument("--tsv", type=Path, default=LIBRISPEECH_TSV, help="audio<TAB>reference list (LibriSpeech)")
    parser.add_argument("--limit", type=int, default=20, help="the first N utterances (default: 20)")
    parser.add_argument("--model", default="tiny.en", help="model name or directory (default: %(default)s)")
    parser.add_argument("--threads", type=int, default=None, help="model CPU threads (default: one per core)")
    parser.add_argument("--engine", choices=["real", "fake"], default="real", help="fake: scripted engine, no model")
    add_docs_argument(parser)


def format_rows(rows: list[QuantRow]) -> str:
    baseline = next((r for r in rows if r.rtf), None)
    table = []
    for row in rows:
        if row.skipped is not None:
            table.append([row.config, "-", "-", "-", "-", "-", f"skipped: {row.skipped}"])
            continue
        speed = baseline.rtf / row.rtf if baseline and baseline.rtf and row.rtf else None
        table.append(
            [
                row.config,
                f"{row.wer:.2f}" if row.wer is not None else "-",
                f"{row.rtf:.3f}" if row.rtf is not None else "-",
                f"{speed:.2f}x" if speed is not None else "-",
                f"{row.peak_rss_mib:.0f}" if row.peak_rss_mib is not None else "-",
                f"{row.peak_rss_mib - row.base_rss_mib:.0f}"
                if row.peak_rss_mib is not None and row.base_rss_mib is not None
                else "-",
                "",
            ]
        )
    measured = [r for r in rows if r.skipped is None]
    files = measured[0].files if measured else 0
    audio = measured[0].audio_seconds if measured else 0.0
    header = ["config", "WER %", "RTF", f"speed vs {baseline.config if baseline else '-'}", "peak RSS MiB",
              "model+work MiB", "note"]  # fmt: skip
    return "\n".join(
        [
            f"{files} utterances, {audio:.1f} s of audio; one process per configuration, run one after the other. "
            "RTF: engine wall time over audio duration (lower is faster). Peak RSS: the process's VmHWM; "
            "model+work: the peak minus the RSS before the model loaded. GPU memory is not counted.",
            "",
            format_table(header, table),
        ]
    )


def run(args: argparse.Namespace) -> int:
    from streamer.engine import CONFIGS

    configs = args.config or list(SEED_CONFIGS)
    for name in configs:
        if name not in CONFIGS:
            raise ConfigError(f"unknown --config {name!r}: use one of {', '.join(CONFIGS)}")
    if args.limit < 1:
        raise ConfigError("--limit must be at least 1")
    if not args.tsv.exists():
        raise ConfigError(f"{args.tsv}: no such file")
    machine = machine_note()
    rows = []
    for name in configs:
        print(f"{name} ...", file=sys.stderr)
        spec = QuantSpec(name, args.model, args.tsv, args.limit, fake=args.engine == "fake", threads=args.threads)
        # a fresh process per configuration, so that peak memory is its own
        with ProcessPoolExecutor(max_workers=1, mp_context=get_context("spawn")) as pool:
            rows.append(pool.submit(measure, spec).result())
    body = format_rows(rows)
    print(body)
    figures = {
        "machine": machine,
        "model": args.model,
        "dataset": str(args.tsv),
        "rows": [{**r.__dict__, "rtf": r.rtf} for r in rows],
    }
    report = Report("quant", command_line("quant", args), body, figures)
    print(f"wrote {write_report(report, args.docs)}", file=sys.stderr)
    return 0
