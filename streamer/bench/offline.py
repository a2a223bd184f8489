"""``streamer bench offline``: streamer's engine against faster-whisper on the same tiny.en weights, same threads,
beam 1, interleaved file by file in one run; prints WER for each and the real-time-factor ratio.

``--isa all`` (or a list of kernel classes) repeats the whole measurement once per x86 kernel class this CPU can be
capped to (:mod:`streamer.engine.kernels`), each in a child process whose oneDNN, ATen and fbgemm are capped to that
class and whose CTranslate2 is capped with ``CT2_FORCE_CPU_ISA``, so one run prints every class side by side: for each,
streamer's RTF and WER per configuration and faster-whisper int8's, and which configuration the engine's default
picks there.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from streamer.bench.report import Report, add_docs_argument, command_line, format_table, machine_note, write_report
from streamer.core.errors import ConfigError

if TYPE_CHECKING:
    from streamer.engine import EngineOptions

__all__ = ["ISA_CAPS", "configure_parser", "run"]

SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "data"
DEFAULT_TSV = SHARED / "librispeech" / "transcripts.tsv"
ENGLISH_LONGFORM = SHARED / "longform"

# Per kernel class: the caps that make a CPU of a higher class run that class's kernels. CTranslate2's names are
# its own (CT2_FORCE_CPU_ISA: GENERIC, AVX, AVX2, AVX512); fbgemm's FBGEMM_ENABLE_INSTRUCTIONS.
ISA_CAPS: dict[str, dict[str, str]] = {
    "avx2": {
        "ONEDNN_MAX_CPU_ISA": "AVX2",
        "ATEN_CPU_CAPABILITY": "avx2",
        "FBGEMM_ENABLE_INSTRUCTIONS": "AVX2",
        "CT2_FORCE_CPU_ISA": "AVX2",
    },
    "avx512": {
        "ONEDNN_MAX_CPU_ISA": "AVX512_CORE",
        "FBGEMM_ENABLE_INSTRUCTIONS": "AVX512",
        "CT2_FORCE_CPU_ISA": "AVX512",
    },
    "avx512-vnni": {
        "ONEDNN_MAX_CPU_ISA": "AVX512_CORE_VNNI",
        "FBGEMM_ENABLE_INSTRUCTIONS": "AVX512_VNNI",
        "CT2_FORCE_CPU_ISA": "AVX512",
    },
    "avx512-bf16": {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16", "CT2_FORCE_CPU_ISA": "AVX512"},
    "amx": {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_AMX", "CT2_FORCE_CPU_ISA": "AVX512"},
}


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tsv", type=Path, default=None, help="audio<TAB>reference list (default: see --set)")
    parser.add_argument(
        "--set",
        choices=("librispeech", "pooled"),
        default="librispeech",
        help="without --tsv: the 66 LibriSpeech utterances, or those plus the English long-form files (pooled)",
    )
    parser.add_argument("--model", default="tiny.en", help="bundled CTranslate2 model both engines load")
    parser.add_argument("--threads", type=int, default=2, help="threads for both engines")
    parser.add_argument("--limit", type=int, default=0, help="only the first N files")
    parser.add_argument(
        "--config", action="append", default=None, help="streamer engine configuration, repeatable (default: default)"
    )
    parser.add_argument("--compute-type", default="int8", help="faster-whisper compute type (int8, float32)")
    parser.add_argument(
        "--isa",
        default=None,
        metavar="CLASS[,CLASS]|all",
        help=f"repeat per kernel class in capped child processes: {', '.join(ISA_CAPS)}, or all this CPU reaches",
    )
    startup = parser.add_argument_group("start-up (the whole transcribe command against faster-whisper's script)")
    startup.add_argument(
        "--startup",
        action="store_true",
        help="time `streamer transcribe` from process start to exit on one short file and on --many files instead",
    )
    startup.add_argument("--many", type=int, default=50, help="files in the larger set (default: 50)")
    startup.add_argument("--rounds", type=int, default=5, help="runs of every command on each set (default: 5)")
    startup.add_argument("--against", metavar="REV", help="also time `streamer transcribe` as committed at REV")
    parser.add_argument("--emit-json", type=Path, default=None, help=argparse.SUPPRESS)  # a child's figures
    add_docs_argument(parser)


@dataclass(frozen=True)
class Item:
    path: Path
    reference: str


def _items(args: argparse.Namespace) -> list[Item]:
    from streamer.offline.evaluate import read_dataset

    if args.tsv is not None:
        items = [Item(i.path, i.reference) for i in read_dataset(args.tsv)]
    else:
        items = [Item(i.path, i.reference) for i in read_dataset(DEFAULT_TSV)]
        if args.set == "pooled":
            languages = {
                line.split("\t")[0]: line.split("\t")[1]
                for line in (ENGLISH_LONGFORM / "metadata.tsv").read_text(encoding="utf-8").splitlines()[1:]
            }
            for item in read_dataset(ENGLISH_LONGFORM / "transcripts.tsv"):
                if languages.get(item.path.name) == "en":
                    items.append(Item(item.path, item.reference))
    return items[: args.limit] if args.limit else items


def _on_the_cpu(options: EngineOptions) -> EngineOptions:
    """A configuration that leaves a component's device unset runs it on the CPU here, beside faster-whisper's CPU
    engine, also on a machine with a GPU (where ``load_engine`` would put it on the GPU); one that names a device
    keeps it."""
    return replace(
        options, encoder_device=options.encoder_device or "cpu", decoder_device=options.decoder_device or "cpu"
    )


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Transcribe every item with each streamer configuration and with faster-whisper, taking turns file by file;
    the figures (WER %, RTF, seconds) per engine and configuration."""
    try:
        from faster_whisper import WhisperModel
    except ImportError:
        raise ConfigError("this benchmark needs faster-whisper: pip install 'streamer[bench]'") from None
    from streamer.engine import CONFIGS, load_engine
    from streamer.engine.kernels import kernel_report
    from streamer.engine.models import resolve
    from streamer.offline.audiofile import load_audio
    from streamer.offline.normalize import normalize_english, word_error_rate
    from streamer.offline.transcribe import TranscribeOptions, transcribe

    configs = args.config or ["default"]
    for name in configs:
        if name not in CONFIGS:
            raise ConfigError(f"unknown --config {name!r}: use one of {', '.join(CONFIGS)}")
    items = _items(args)
    ours: dict[str, Any] = {}
    skipped: dict[str, str] = {}
    for name in configs:
        try:
            ours[name] = load_engine(args.model, _on_the_cpu(replace(CONFIGS[name], threads=args.threads)))
        except ConfigError as error:  # e.g. bf16 where this class's kernels cannot run it
            skipped[name] = str(error)
    source = resolve(args.model)
    theirs = WhisperModel(str(source.directory), device="cpu", compute_type=args.compute_type, cpu_threads=args.threads)
    # both sides decode whole files without VAD, greedy, so the comparison is engine against engine
    options = TranscribeOptions(vad=None)  # its default decoding: no word timings, the offline encoder span
    refs: list[str] = []
    hyps: dict[str, list[str]] = {name: [] for name in [*ours, "faster-whisper"]}
    seconds: dict[str, float] = dict.fromkeys(hyps, 0.0)
    audio_seconds = 0.0
    for index, item in enumerate(items):
        audio = load_audio(item.path).samples
        audio_seconds += len(audio) / 16000
        refs.append(normalize_english(item.reference))
        # rotate who goes first so that none gets a systematically warmer cache
        order = list(hyps)
        order = order[index % len(order) :] + order[: index % len(order)]
        for who in order:
            start = time.perf_counter()
            if who == "faster-whisper":
                segments, _ = theirs.transcribe(audio, beam_size=1, language="en", vad_filter=False)
                text = " ".join(s.text for s in segments)
            else:
                text = transcribe(ours[who], audio, options).text
            seconds[who] += time.perf_counter() - start
            hyps[who].append(normalize_english(text))
        print(f"\r{index + 1}/{len(items)} files", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    report = kernel_report()
    return {
        "kernels": report.describe(),
        "kernel_class": report.kernel_class.label,
        "default_encoder": report.default_encoder,
        "files": len(items),
        "audio_seconds": audio_seconds,
        "threads": args.threads,
        "engines": {
            who: {
                "wer": word_error_rate(refs, hyps[who]).wer * 100,
                "rtf": seconds[who] / audio_seconds,
                "encoder": getattr(ours.get(who), "info", None) and ours[who].info.encoder,
            }
            for who in hyps
        },
        "skipped": skipped,
        "compute_type": args.compute_type,
    }


def _classes(spec: str) -> list[str]:
    from streamer.engine.kernels import KernelClass, cpu_features

    reachable = cpu_features().kernel_class
    names = list(ISA_CAPS) if spec == "all" else [s.strip() for s in spec.split(",") if s.strip()]
    for name in names:
        if name not in ISA_CAPS:
            raise ConfigError(f"unknown kernel class {name!r} for --isa: {', '.join(ISA_CAPS)} or all")
    return [n for n in names if KernelClass.parse(n) <= reachable]


def _child(args: argparse.Namespace, caps: dict[str, str]) -> dict[str, Any]:
    """Run :func:`measure` in a child process under ``caps`` (the libraries read them once, at load)."""
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "figures.json"
        command = [sys.executable, "-m", "streamer", "bench", "offline", "--emit-json", str(out)]
        for key in ("tsv", "model", "threads", "limit", "compute_type"):
            value = getattr(args, key)
            if value not in (None, 0):
                command += [f"--{key.replace('_', '-')}", str(value)]
        command += ["--set", args.set]
        for name in args.config or ["default"]:
            command += ["--config", name]
        environment = {k: v for k, v in os.environ.items() if k not in {c for v in ISA_CAPS.values() for c in v}}
        subprocess.run(command, env={**environment, **caps}, check=True)
        figures: dict[str, Any] = json.loads(out.read_text(encoding="utf-8"))
        return figures


def run(args: argparse.Namespace) -> int:
    if args.startup:
        from streamer.bench.startup import run_startup

        return run_startup(args)
    if args.emit_json is not None:
        args.emit_json.write_text(json.dumps(measure(args)), encoding="utf-8")
        return 0
    machine = machine_note()
    if args.isa is None:
        per_class = {"native": measure(args)}
    else:
        classes = _classes(args.isa)
        if not classes:
            raise ConfigError(f"this CPU reaches none of the kernel classes {args.isa!r}")
        per_class = {}
        for name in classes:
            print(f"kernel class {name}: {ISA_CAPS[name]}", file=sys.stderr)
            per_class[name] = _child(args, ISA_CAPS[name])
    rows = []
    for name, figures in per_class.items():
        fw = figures["engines"]["faster-whisper"]
        for who, engine in figures["engines"].items():
            ratio = fw["rtf"] / engine["rtf"] if engine["rtf"] else 0.0
            label = f"faster-whisper {figures['compute_type']}" if who == "faster-whisper" else f"streamer {who}"
            if who == "default":
                label += f" ({engine['encoder']})"
            rows.append([name, label, f"{engine['wer']:.2f}", f"{engine['rtf']:.4f}", f"{ratio:.2f}x"])
        rows += [[name, f"streamer {who}", "-", "-", f"skipped: {why}"] for who, why in figures["skipped"].items()]
    table = format_table(["kernel class", "engine", "WER %", "RTF", "speed vs faster-whisper"], rows)
    first = next(iter(per_class.values()))
    kernels = "\n".join(f"- {name}: {figures['kernels']}" for name, figures in per_class.items())
    body = (
        f"{first['files']} files, {first['audio_seconds']:.1f} s of audio, {first['threads']} threads, beam 1, no VAD, "
        "every engine taking turns file by file (who goes first rotates); speed is faster-whisper's time over each "
        f"engine's.\n\n{table}\n\nKernels per class:\n\n{kernels}"
    )
    print(f"offline benchmark: {body}")
    figures_out = {"machine": machine, "classes": per_class}
    report = Report("offline", command_line("offline", args), body, figures_out)
    print(f"wrote {write_report(report, args.docs)}", file=sys.stderr)
    return 0
