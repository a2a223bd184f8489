"""``streamer bench profile``: offline speed in batches and where a decoder pass's time goes (issue 37).

The utterances of a LibriSpeech list are decoded as one window each (greedy, no fallback, no word timestamps), in
batches of each ``--batch-size``, after one untimed pass over the set at the largest: the real-time factor (engine
wall time over audio) and the pooled WER per batch size, side by side in one run. Then one more pass at the largest
batch size under ``torch.profiler``: per decoder pass, the kernel launches and the host synchronisations
(``cudaStreamSynchronize``, ``cudaDeviceSynchronize``, ``cudaEventSynchronize``, blocking ``cudaMemcpy``), the
share of the wall time some GPU kernel ran (the union of the kernels' intervals), and the operators and kernels that
took the most time. On a machine without CUDA the same run profiles the CPU (no kernel figures): the section then
says so.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from streamer.bench.report import Report, add_docs_argument, command_line, format_table, machine_note, write_report

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    from streamer.engine.types import Engine

__all__ = ["ProfileFigures", "configure_parser", "profile_figures", "run"]

# CUDA runtime and driver calls that start work on the device
LAUNCHES = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx", "cudaGraphLaunch")
# calls that make the host wait for the device
SYNCS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy")
TOP = 8


def configure_parser(parser: argparse.ArgumentParser) -> None:
    from streamer.bench.quant import LIBRISPEECH_TSV

    parser.add_argument("--config", default=None, help="engine configuration (default: fp16 with CUDA, else default)")
    parser.add_argument("--tsv", type=Path, default=LIBRISPEECH_TSV, help="audio<TAB>reference list (LibriSpeech)")
    parser.add_argument("--limit", type=int, default=64, help="the first N utterances (default: 64)")
    parser.add_argument(
        "--batch-size", type=int, action="append", help="windows per engine call, repeatable (default: 1, 16, 64)"
    )
    parser.add_argument("--model", default="tiny.en", help="model name or directory (default: %(default)s)")
    parser.add_argument("--trace", type=Path, default=None, help="also write the profile's Chrome trace here")
    add_docs_argument(parser)


@dataclass(frozen=True)
class ProfileFigures:
    """What one profiled pass over the set shows."""

    wall_seconds: float
    passes: int  # decoder passes (a batch's rows step together: its most passes)
    launches: int  # kernel launches (CUDA runtime and driver calls)
    syncs: int  # host synchronisations
    gpu_busy_seconds: float | None  # the union of the kernels' intervals; None without CUDA
    top_operators: list[tuple[str, float, int]]  # (name, self CPU seconds, calls)
    top_kernels: list[tuple[str, float, int]]  # (name, device seconds, launches)

    @property
    def gpu_busy_share(self) -> float | None:
        if self.gpu_busy_seconds is None or not self.wall_seconds:
            return None
        return self.gpu_busy_seconds / self.wall_seconds


def _union_seconds(intervals: Iterable[tuple[float, float]]) -> float:
    """The length of the union of ``(start, end)`` intervals in microseconds, in seconds."""
    total = 0.0
    end = float("-inf")
    for start, stop in sorted(intervals):
        if stop <= end:
            continue
        total += stop - max(start, end)
        end = stop
    return total / 1e6


def profile_figures(events: Sequence[Any], wall_seconds: float, passes: int, cuda: bool) -> ProfileFigures:
    """The figures of a ``torch.profiler`` run's ``events()``."""
    from torch.profiler import DeviceType

    kernels = [e for e in events if e.device_type == DeviceType.CUDA]
    host = [e for e in events if e.device_type != DeviceType.CUDA]
    names = Counter(e.name for e in host)
    operators: dict[str, list[float]] = {}
    for event in host:
        if event.name.startswith("aten::"):
            entry = operators.setdefault(event.name, [0.0, 0])
            entry[0] += event.self_cpu_time_total / 1e6
            entry[1] += 1
    by_kernel: dict[str, list[float]] = {}
    for event in kernels:
        entry = by_kernel.setdefault(event.name, [0.0, 0])
        entry[0] += event.time_range.elapsed_us() / 1e6
        entry[1] += 1

    def top(table: dict[str, list[float]]) -> list[tuple[str, float, int]]:
        ranked = sorted(table.items(), key=lambda item: item[1][0], reverse=True)[:TOP]
        return [(name, seconds, int(calls)) for name, (seconds, calls) in ranked]

    busy = _union_seconds((e.time_range.start, e.time_range.end) for e in kernels) if cuda else None
    return ProfileFigures(
        wall_seconds=wall_seconds,
        passes=passes,
        launches=sum(names[n] for n in LAUNCHES),
        syncs=sum(names[n] for n in SYNCS),
        gpu_busy_seconds=busy,
        top_operators=top(operators),
        top_kernels=top(by_kernel),
    )


def _decode_set(engine: Engine, audio: Sequence[npt.NDArray[np.float32]], batch: int) -> tuple[list[str], float, int]:
    """Every window decoded in batches of ``batch``: the texts, the engine's wall seconds, the decoder passes."""
    from streamer.engine import DecodeOptions, DecodeRequest

    options = DecodeOptions(temperatures=(0.0,), word_timestamps=False)
    texts: list[str] = []
    seconds = 0.0
    passes = 0
    for start in range(0, len(audio), batch):
        requests = [
            DecodeRequest(audio=a, options=options, request_id=start + i)
            for i, a in enumerate(audio[start : start + batch])
        ]
        began = time.perf_counter()
        results = engine.decode(requests)
        seconds += time.perf_counter() - began
        passes += max(r.decoder_passes for r in results)
        texts += [r.text for r in results]
    return texts, seconds, passes


def run(args: argparse.Namespace) -> int:
    import torch
    from torch.profiler import ProfilerActivity, profile

    from streamer.core.units import N_SAMPLES, SAMPLE_RATE
    from streamer.engine import CONFIGS, cuda_available, load_engine
    from streamer.offline.audiofile import load_audio
    from streamer.offline.evaluate import read_dataset
    from streamer.offline.normalize import normalize_english, word_error_rate

    cuda = cuda_available()
    config = args.config or ("fp16" if cuda else "default")
    if config not in CONFIGS:
        print(f"profile: unknown configuration {config!r} (one of {', '.join(CONFIGS)})", file=sys.stderr)
        return 2
    batches = sorted(set(args.batch_size or [1, 16, 64]))
    if batches[0] < 1:
        print("profile: batch sizes are at least 1", file=sys.stderr)
        return 2
    machine = machine_note()
    if cuda:
        machine += f"; GPU {torch.cuda.get_device_name()}, torch {torch.__version__}, CUDA {torch.version.cuda}"
    items = read_dataset(args.tsv, limit=args.limit)
    loaded = [(item, load_audio(item.path).samples) for item in items]
    kept = [(item, a) for item, a in loaded if len(a) <= N_SAMPLES]  # one window each
    audio = [a for _, a in kept]
    references = [normalize_english(item.reference) for item, _ in kept]
    seconds_of_audio = sum(len(a) for a in audio) / SAMPLE_RATE
    engine = load_engine(args.model, CONFIGS[config])
    try:
        _decode_set(engine, audio, batches[-1])  # untimed: every shape and kernel met once
        rows = []
        figures: dict[str, Any] = {"machine": machine, "config": config, "windows": len(audio)}
        for batch in batches:
            texts, seconds, passes = _decode_set(engine, audio, batch)
            wer = word_error_rate(references, [normalize_english(t) for t in texts]).wer * 100
            rtf = seconds / seconds_of_audio
            rows.append([str(batch), f"{rtf:.4f}", f"{wer:.2f}", str(passes), f"{1000 * seconds / passes:.2f}"])
            figures[f"batch_{batch}"] = {"rtf": rtf, "wer": wer, "passes": passes, "seconds": seconds}
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        with profile(activities=activities) as prof:
            began = time.perf_counter()
            _, _, passes = _decode_set(engine, audio, batches[-1])
            if cuda:
                torch.cuda.synchronize()
            wall = time.perf_counter() - began
        if args.trace is not None:
            prof.export_chrome_trace(str(args.trace))
        found = profile_figures(prof.events(), wall, passes, cuda)
    finally:
        engine.close()
    share = found.gpu_busy_share
    lines = [
        f"{len(audio)} utterances of {args.tsv.name} ({seconds_of_audio:.0f} s; {len(loaded) - len(audio)} longer than "
        f"a window left out), each one window, greedy without fallback or word timestamps; configuration {config}. "
        "Real-time factor: the engine's wall time over the audio's duration, after one untimed pass.",
        "",
        format_table(["batch size", "RTF", "WER %", "decoder passes", "engine ms per pass"], rows),
        "",
        f"Profiled pass at batch size {batches[-1]}: {found.wall_seconds:.2f} s, {found.passes} decoder passes.",
        "",
        "```",
        f"kernel launches per decoder pass: {found.launches / max(found.passes, 1):.1f}",
        f"host synchronisations per decoder pass: {found.syncs / max(found.passes, 1):.2f}",
        f"GPU busy: {'no CUDA device here' if share is None else f'{100 * share:.1f} % of the wall time'}",
        "```",
        "",
        format_table(
            ["operator (host)", "self s", "calls"], [[n, f"{s:.3f}", str(c)] for n, s, c in found.top_operators]
        ),
    ]
    if found.top_kernels:
        lines += [
            "",
            format_table(["kernel", "s", "launches"], [[n[:80], f"{s:.4f}", str(c)] for n, s, c in found.top_kernels]),
        ]
    body = "\n".join(lines)
    print(f"profile benchmark: {body}")
    figures["profile"] = {
        "batch_size": batches[-1],
        "wall_seconds": found.wall_seconds,
        "passes": found.passes,
        "launches": found.launches,
        "syncs": found.syncs,
        "gpu_busy_share": share,
    }
    report = Report("profile", command_line("profile", args), body, figures)
    print(f"wrote {write_report(report, args.docs)}", file=sys.stderr)
    return 0
