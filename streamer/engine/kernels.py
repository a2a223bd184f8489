"""Which CPU kernels torch will really run here, and the encoder precision that follows from them.

A CPU's flags say what it can do; what the engine runs is narrower. oneDNN (which runs the bf16 encoder's GEMMs)
honours ``ONEDNN_MAX_CPU_ISA`` / ``DNNL_MAX_CPU_ISA``, as containers and VMs set them, and a hypervisor can hide
AVX-512 state that CPUID still reports: with oneDNN capped at AVX2, a bf16 ``Linear`` raises "could not create a
primitive descriptor" although the CPU has AVX512-BF16 (issue 15, issue 19). So the kernel class is the CPU's class
capped by oneDNN's limit, and bf16 is only counted once a bf16 ``Linear`` has actually run.

Classes, from the kernels each one unlocks (oneDNN's ISA names in brackets):

====================  ==================================================  ===================
class                 what changes                                        default encoder
====================  ==================================================  ===================
``generic``           no AVX2: reference kernels                          int8
``avx2``              AVX2/FMA GEMMs; fbgemm's AVX2 int8                  int8
``avx512``            AVX-512 GEMMs (AVX512_CORE); bf16 only emulated     int8
``avx512-vnni``       int8 dot products in one instruction (VNNI)         int8
``avx512-bf16``       bf16 dot products (AVX512_CORE_BF16)                bf16
``amx``               bf16/int8 tile multiplies (AVX512_CORE_AMX)         bf16
====================  ==================================================  ===================

The defaults come from :data:`DEFAULT_ENCODER` and the measurements cited there; :func:`select_encoder_precision`
is a pure function of the class so that every class's choice is tested on any machine.

Below the VNNI classes oneDNN's INT8 GEMM clips sums of two products at int16 (:func:`int8_products_exact`, a probe
like the bf16 one), which the INT8 decoder works around (issue 38).
"""

from __future__ import annotations

import functools
import logging
import os
import platform
import re
from dataclasses import dataclass
from enum import IntEnum
from pathlib import Path

__all__ = [
    "DEFAULT_ENCODER",
    "OPENMP_SPIN_COUNT",
    "CpuFeatures",
    "KernelClass",
    "KernelReport",
    "available_cores",
    "bf16_linear_runs",
    "cores_taken",
    "cpu_features",
    "cpu_model_name",
    "int8_products_exact",
    "kernel_report",
    "limit_openmp_spinning",
    "onednn_cap",
    "runnable_elsewhere",
    "select_encoder_precision",
    "use_threads",
]

log = logging.getLogger(__name__)


class KernelClass(IntEnum):
    """The kernel classes in the order each adds to the one before (a cap keeps the lower of two)."""

    GENERIC = 0
    AVX2 = 1
    AVX512 = 2
    AVX512_VNNI = 3
    AVX512_BF16 = 4
    AMX = 5

    @property
    def label(self) -> str:
        return self.name.lower().replace("_", "-")

    @classmethod
    def parse(cls, label: str) -> KernelClass:
        """``avx512-bf16`` (or ``AVX512_BF16``) -> the class; ValueError naming the choices otherwise."""
        key = label.strip().upper().replace("-", "_")
        if key not in cls.__members__:
            choices = ", ".join(member.label for member in cls)
            raise ValueError(f"unknown kernel class {label!r}: one of {choices}")
        return cls[key]


# The encoder precision per class (fp32 decoder throughout: see load_engine). Measured with `streamer eval` on the 66
# LibriSpeech utterances of ../shared/data (tiny.en, greedy): on an AMX Xeon, fp32 8.94% WER, INT8 encoder 9.26%,
# bf16 encoder 8.78% at about half the INT8 encoder's time; on an AMD EPYC with AVX512-BF16 and no AMX, fp32 8.86%,
# INT8 encoder 9.50%, bf16 encoder 9.02%. Without bf16 dot products oneDNN widens bf16 to fp32 inside each GEMM, so
# bf16 buys nothing there and the INT8 encoder (fbgemm) is the fast one.
DEFAULT_ENCODER: dict[KernelClass, str] = {
    KernelClass.GENERIC: "int8",
    KernelClass.AVX2: "int8",
    KernelClass.AVX512: "int8",
    KernelClass.AVX512_VNNI: "int8",
    KernelClass.AVX512_BF16: "bf16",
    KernelClass.AMX: "bf16",
}

# oneDNN's ISA cap names (its docs' "CPU dispatcher control"), each mapped to the highest class it still allows.
# AVX2_VNNI(_2) add 256-bit VNNI and bf16 conversions, not bf16 dot products: they stay in the AVX2 class.
_ONEDNN_CAPS: dict[str, KernelClass] = {
    "SSE41": KernelClass.GENERIC,
    "AVX": KernelClass.GENERIC,
    "AVX2": KernelClass.AVX2,
    "AVX2_VNNI": KernelClass.AVX2,
    "AVX2_VNNI_2": KernelClass.AVX2,
    "AVX512_CORE": KernelClass.AVX512,
    "AVX512_CORE_VNNI": KernelClass.AVX512_VNNI,
    "AVX512_CORE_BF16": KernelClass.AVX512_BF16,
    "AVX512_CORE_FP16": KernelClass.AVX512_BF16,
    "AVX10_1_512": KernelClass.AVX512_BF16,
    "AVX10_2_512": KernelClass.AVX512_BF16,
    "AVX512_CORE_AMX": KernelClass.AMX,
    "AVX512_CORE_AMX_FP16": KernelClass.AMX,
    "AVX10_1_512_AMX": KernelClass.AMX,
    "AVX10_1_512_AMX_FP16": KernelClass.AMX,
    "AVX10_2_512_AMX_2": KernelClass.AMX,
    "ALL": KernelClass.AMX,
    "DEFAULT": KernelClass.AMX,
}


@dataclass(frozen=True)
class CpuFeatures:
    """The ISA features that pick kernels, as the CPU reports them (before any cap)."""

    avx2: bool
    avx512: bool
    vnni: bool  # AVX512-VNNI (int8 dot products)
    bf16: bool  # AVX512-BF16 (bf16 dot products)
    amx: bool  # AMX tiles

    @property
    def kernel_class(self) -> KernelClass:
        for present, kernel_class in (
            (self.amx, KernelClass.AMX),
            (self.bf16 and self.avx512, KernelClass.AVX512_BF16),
            (self.vnni and self.avx512, KernelClass.AVX512_VNNI),
            (self.avx512, KernelClass.AVX512),
            (self.avx2, KernelClass.AVX2),
        ):
            if present:
                return kernel_class
        return KernelClass.GENERIC

    def names(self) -> list[str]:
        """The present features by their usual names, for reports: ``["AVX2", "AVX-512", "VNNI", "BF16"]``."""
        labels = (("AVX2", self.avx2), ("AVX-512", self.avx512), ("VNNI", self.vnni), ("BF16", self.bf16))
        return [name for name, present in (*labels, ("AMX", self.amx)) if present]


def onednn_cap(environ: dict[str, str] | None = None) -> tuple[str | None, KernelClass]:
    """oneDNN's ISA cap from the environment (``ONEDNN_MAX_CPU_ISA``, else ``DNNL_MAX_CPU_ISA``) and the class it
    allows; no cap (or a name oneDNN does not know, which it ignores too) allows every class."""
    env = os.environ if environ is None else environ
    raw = env.get("ONEDNN_MAX_CPU_ISA") or env.get("DNNL_MAX_CPU_ISA")
    if not raw:
        return None, KernelClass.AMX
    return raw, _ONEDNN_CAPS.get(raw.strip().upper(), KernelClass.AMX)


def select_encoder_precision(cpu: KernelClass, cap: KernelClass, bf16_runs: bool) -> tuple[KernelClass, str]:
    """The class the engine will run in and the CPU encoder precision for it: the CPU's class capped by oneDNN's
    limit, and below the bf16 classes when a bf16 ``Linear`` does not run (the probe failed)."""
    effective = min(cpu, cap)
    if effective >= KernelClass.AVX512_BF16 and not bf16_runs:
        effective = KernelClass.AVX512_VNNI if cpu >= KernelClass.AVX512_VNNI else KernelClass.AVX512
    return effective, DEFAULT_ENCODER[effective]


def cpu_features() -> CpuFeatures:
    """What the CPU reports (torch's cpuinfo: the same source torch's dispatch reads)."""
    import torch

    cpu = torch.cpu

    def has(name: str) -> bool:
        check = getattr(cpu, name, None)
        return bool(check()) if check is not None else False

    return CpuFeatures(
        avx2=has("_is_avx2_supported"),
        avx512=has("_is_avx512_supported"),
        vnni=has("_is_vnni_supported"),
        bf16=has("_is_avx512_bf16_supported"),
        amx=has("_is_amx_tile_supported"),
    )


@functools.cache
def bf16_linear_runs() -> bool:
    """Run the bf16 encoder's two kinds of product once, small (a plain ``Linear`` and the fused linear+GELU
    oneDNN kernel of :func:`~streamer.engine.network.linear_gelu`): False where torch's kernels cannot (oneDNN
    capped below bf16 raises "could not create a primitive descriptor" on the fused one). Cached: the answer
    cannot change within a process."""
    import torch

    from streamer.engine.network import linear_gelu

    try:
        with torch.inference_mode():
            layer = torch.nn.Linear(64, 64).to(torch.bfloat16)
            x = torch.ones(1, 16, 64, dtype=torch.bfloat16)
            out = linear_gelu(layer, layer(x))
        return bool(torch.isfinite(out.float()).all())
    except RuntimeError as error:
        log.info("bf16 kernels do not run here: %s", str(error).splitlines()[0])
        return False


# The INT8 probe's input width: a few of vpmaddubsw's pairs (every pair of a saturating kernel clips, at any shape)
_INT8_PROBE_WIDTH = 64


@functools.cache
def int8_products_exact() -> bool:
    """Whether ``torch._int_mm`` (oneDNN's s8s8 GEMM) sums INT8 products exactly here, even where every pair of
    products is at its largest: call before trusting it with full-range INT8 on both sides, as
    :mod:`streamer.engine.rowwise` does. Cached: the kernels cannot change within a process.

    Without VNNI (a CPU without it, or oneDNN capped at ``AVX2`` or ``AVX512_CORE``) oneDNN runs s8 x s8 as u8 x s8,
    the left operand shifted by 128 and the shift's product subtracted after, with vpmaddubsw, which adds each pair of
    u8 x s8 products into a saturating int16: (127 + 128) * 127 * 2 = 64,770 clips at 32,767 (issue 38). VNNI's
    vpdpbusd adds the products into int32. The probe puts every pair at that extreme, so any clipping shows; on this
    project's Zen 4 every shape from 1 x 2 x 1 to 17 x 1536 x 384 clipped alike under both caps."""
    import torch

    left = torch.full((1, _INT8_PROBE_WIDTH), 127, dtype=torch.int8)
    right = torch.full((_INT8_PROBE_WIDTH, 8), 127, dtype=torch.int8)
    with torch.inference_mode():
        product = torch._int_mm(left, right)
    exact = bool((product == _INT8_PROBE_WIDTH * 127 * 127).all())
    if not exact:
        log.info("INT8 GEMM saturates its pair sums here (no VNNI): the INT8 decoder splits its activations")
    return exact


def cpu_model_name() -> str:
    """The CPU's model name (``/proc/cpuinfo`` on Linux), for benchmark reports."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


@dataclass(frozen=True)
class KernelReport:
    """The CPU and the kernels it gets, for logs and every benchmark section."""

    model: str
    features: CpuFeatures
    cpu_class: KernelClass  # from the CPU's flags alone
    onednn_cap: str | None  # ONEDNN_MAX_CPU_ISA as set, or None
    aten_capability: str  # ATen's vectorised kernels: DEFAULT, AVX2, AVX512 (ATEN_CPU_CAPABILITY caps it)
    bf16_runs: bool
    kernel_class: KernelClass  # what the engine runs in: capped, probed
    default_encoder: str  # the CPU default that follows
    torch_version: str
    onednn_version: str
    int8_exact: bool = True  # int8_products_exact(): False where the INT8 decoder splits its activations

    def describe(self) -> str:
        """One line: ``AMD EPYC (AVX2 AVX-512 VNNI BF16; class avx512-bf16, default encoder bf16; torch 2.13.0,
        oneDNN 3.12.0, ATen AVX512)``; a cap is named where one is set, and ``INT8 GEMM saturates`` where it does."""
        cap = f", ONEDNN_MAX_CPU_ISA={self.onednn_cap}" if self.onednn_cap else ""
        saturates = "" if self.int8_exact else ", INT8 GEMM saturates"
        return (
            f"{self.model} ({' '.join(self.features.names()) or 'no AVX2'}; class {self.kernel_class.label}{cap}, "
            f"default encoder {self.default_encoder}{saturates}; torch {self.torch_version}, "
            f"oneDNN {self.onednn_version}, ATen {self.aten_capability})"
        )


def kernel_report() -> KernelReport:
    """Detect everything above (imports torch; runs the bf16 and INT8 probes once)."""
    import torch

    features = cpu_features()
    cap_name, cap = onednn_cap()
    runs = bf16_linear_runs() if min(features.kernel_class, cap) >= KernelClass.AVX512_BF16 else False
    effective, encoder = select_encoder_precision(features.kernel_class, cap, runs)
    match = re.search(r"(?:MKL-DNN|oneDNN) v([\d.]+)", torch.__config__.show())
    return KernelReport(
        model=cpu_model_name(),
        features=features,
        cpu_class=features.kernel_class,
        onednn_cap=cap_name,
        aten_capability=str(torch.backends.cpu.get_cpu_capability()),
        bf16_runs=runs,
        kernel_class=effective,
        default_encoder=encoder,
        torch_version=str(torch.__version__).split("+")[0],
        onednn_version=match.group(1) if match else "unknown",
        int8_exact=int8_products_exact(),
    )


# How long an idle OpenMP thread spins before it sleeps, in libgomp's spin iterations (a few microseconds), for the
# one-shot commands when other work wants the cores. libgomp's default (300,000, milliseconds of spinning per wait)
# lets a thread that waits for the next parallel region keep its core from the thread that has work whenever there are
# more runnable threads than cores. On 2 cores shared with other work (load average 12), one 15 s LibriSpeech file
# through `streamer transcribe --threads 2` took 30 to 38 s from start to exit with libgomp's default, 5 to 7 s at
# 1,000 (OMP_WAIT_POLICY=PASSIVE alike), 6 to 10 s at 10,000 and 18 to 20 s at 100,000. On idle cores the default is
# the faster: the decoder's many small products each wake the other thread, and a sleeping thread takes long to wake
# (2026-12-02, the same file, 2 cores of a virtual machine, 8 rounds, medians: 2.32 s at 300,000 and 100,000, 2.59 s
# at 10,000, 2.69 s at 1,000; with two busy processes beside it 5.8, 5.6, 4.1 and 4.0 s). So the spin is limited
# only when the cores are taken: `streamer bench offline --startup` times the command beside both settings.
OPENMP_SPIN_COUNT = "1000"
# reads of the runnable-task count, a millisecond apart, whose least decides (one read can catch a passing task)
_RUNNABLE_READS = 4


def runnable_elsewhere(reads: int = _RUNNABLE_READS, loadavg: Path = Path("/proc/loadavg")) -> int | None:
    """Tasks running or waiting for a CPU now, other than this one (the least over ``reads`` reads of Linux's
    ``/proc/loadavg``, a millisecond apart); None where it cannot be read."""
    import time

    counts = []
    for index in range(reads):
        if index:
            time.sleep(0.001)
        try:
            running = loadavg.read_text().split()[3].split("/")[0]
            counts.append(int(running) - 1)
        except (OSError, IndexError, ValueError):
            return None
    return max(0, min(counts))


def available_cores() -> int:
    """The cores this process may run on (its affinity mask; the machine's count where there is none)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def use_threads(threads: int) -> bool:
    """Run the calling thread's torch operators on ``threads`` threads from now on (torch keeps the count per thread:
    call it on the thread that runs the model). A no-op where torch is not loaded (a model-free engine) or the count
    is already that; True when it changed."""
    import sys

    if threads < 1:
        raise ValueError("threads must be at least 1")
    torch = sys.modules.get("torch")
    if torch is None or torch.get_num_threads() == threads:
        return False
    torch.set_num_threads(threads)
    return True


def limit_openmp_spinning(
    threads: int | None = None, environ: dict[str, str] | None = None, elsewhere: int | None = -1
) -> bool:
    """Set libgomp's spin count to :data:`OPENMP_SPIN_COUNT` when the cores are taken: when the tasks runnable
    elsewhere (``elsewhere``; by default :func:`runnable_elsewhere`, and taken when unknown) and the model's
    ``threads`` (default: one per core) outnumber this process's cores. Never when the user chose
    (``GOMP_SPINCOUNT`` or ``OMP_WAIT_POLICY``). True when set. libgomp reads it once, when torch loads it: call
    before torch is imported (a no-op after, returning False)."""
    import sys

    env = os.environ if environ is None else environ
    if "torch" in sys.modules or "GOMP_SPINCOUNT" in env or "OMP_WAIT_POLICY" in env:
        return False
    cores = available_cores()
    if not cores_taken(threads or cores, runnable_elsewhere() if elsewhere == -1 else elsewhere, cores):
        return False  # idle cores: libgomp's own spin is the faster
    env["GOMP_SPINCOUNT"] = OPENMP_SPIN_COUNT
    return True


def cores_taken(threads: int, elsewhere: int | None, cores: int) -> bool:
    """Whether ``threads`` of ours and the tasks runnable ``elsewhere`` (None: unknown, counted as taken) outnumber
    the ``cores``."""
    return elsewhere is None or elsewhere + threads > cores
