"""The engine package: everything that touches torch lives here, behind :class:`~streamer.engine.types.Engine`.

Import :func:`load_engine` lazily-safe: this module imports no torch until it is called.
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from streamer.core.errors import ConfigError
from streamer.engine.types import (
    DecodeOptions,
    DecodeRequest,
    DecodeResult,
    Engine,
    EngineInfo,
    SegmentResult,
    StreamId,
    Task,
    WordTiming,
)

if TYPE_CHECKING:
    from streamer.engine.models import ModelFiles
    from streamer.engine.whisper import WhisperEngine

__all__ = [
    "CONFIGS",
    "DecodeOptions",
    "DecodeRequest",
    "DecodeResult",
    "Engine",
    "EngineInfo",
    "EngineOptions",
    "SegmentResult",
    "StreamId",
    "Task",
    "WordTiming",
    "cpu_has_native_bf16",
    "cuda_available",
    "default_encoder_precision",
    "gpu_memory_allocated",
    "load_engine",
]

log = logging.getLogger(__name__)

PRECISIONS = ("fp32", "fp16", "bf16", "int8")


@dataclass(frozen=True)
class EngineOptions:
    """Per-component precision and placement. ``None`` picks the default for the machine: without CUDA the encoder
    in the precision the CPU's kernel class calls for (bf16 where bf16 dot products run, else INT8) and an FP32
    decoder, on the CPU; with CUDA, FP16 for both on the GPU (see :func:`default_encoder_precision`)."""

    # encoder precision: fp32, fp16, bf16 or int8 (int8 on the CPU only)
    encoder_precision: str | None = None
    # encoder device: cpu or cuda
    encoder_device: str | None = None
    # decoder precision: fp32, fp16, bf16 or int8 (int8 on the CPU only)
    decoder_precision: str | None = None
    # decoder device: cpu or cuda
    decoder_device: str | None = None
    # torch intra-op threads (None leaves torch's default: one per core)
    threads: int | None = None
    # run one short window at load so the first request pays no start-up cost; off (a one-shot command, whose first
    # real window warms the same kernels), the kernels are only probed at a tiny size, which still catches a
    # precision they cannot run
    warmup: bool = True
    # verify each stream's previous hypothesis as a draft in one pass (same output as plain greedy, fewer passes)
    draft_decoding: bool = True
    # reuse the log-mel frames a stream's previous window already computed (same features, less work)
    incremental_features: bool = True
    # compute a batch's log-mel features on the encoder's device in one batched STFT (the host sends samples, not
    # frames, and hashes nothing); None: on for an encoder on CUDA, off on the CPU (where reusing frames is cheaper)
    features_on_device: bool | None = None
    # vocabulary projection: int8 or fp32; None is int8 for a float decoder on the CPU, else the decoder's precision
    projection_precision: str | None = None
    # keep the weights as placed (cast, quantized) on disk and load them from there next time: see
    # streamer.engine.weights (STREAMER_WEIGHT_CACHE=0 turns it off whatever this says)
    weight_cache: bool = True
    # greedy decoding in static shapes with one host read per pass (streamer.engine.static): the same tokens, for a
    # GPU, where new shapes and host waits cost more than the extra positions it projects; None: on for a decoder on
    # CUDA, off on the CPU
    static_shapes: bool | None = None
    # with static shapes on CUDA, replay each row bucket's decoder step as a captured CUDA graph (one launch instead
    # of a few hundred); off, or where a capture fails, the step runs as it is
    cuda_graphs: bool = True

    def validate(self) -> None:
        for name in ("encoder_precision", "decoder_precision"):
            value = getattr(self, name)
            if value is not None and value not in PRECISIONS:
                raise ConfigError(f"{name.replace('_', ' ')} must be one of {', '.join(PRECISIONS)}, not {value!r}")
        if self.projection_precision not in (None, "int8", "fp32"):
            raise ConfigError(f"projection precision must be int8 or fp32, not {self.projection_precision!r}")
        for name in ("encoder_device", "decoder_device"):
            value = getattr(self, name)
            if value is not None and not (value == "cpu" or value.startswith("cuda")):
                raise ConfigError(f"{name.replace('_', ' ')} must be 'cpu' or 'cuda', not {value!r}")
        if self.threads is not None and self.threads < 1:
            raise ConfigError("threads must be at least 1")


# Named configurations for `streamer eval --config` and the benchmarks (the seed experiment's table).
CONFIGS: dict[str, EngineOptions] = (
    {
        "default": EngineOptions(),  # the machine's defaults (see EngineOptions)
        "fp32": EngineOptions("fp32", "cpu", "fp32", "cpu", projection_precision="fp32"),  # float32 throughout
        "int8-decoder": EngineOptions(decoder_precision="int8", decoder_device="cpu"),  # the class's default encoder
    }
    | {
        name: EngineOptions(encoder_precision=ep, encoder_device=ed, decoder_precision=dp, decoder_device=dd)
        for name, (ep, ed, dp, dd) in {
            "int8-encoder": ("int8", "cpu", "fp32", "cpu"),
            "bf16-encoder": ("bf16", "cpu", "fp32", "cpu"),
            "int8": ("int8", "cpu", "int8", "cpu"),
            "bf16": ("bf16", "cpu", "bf16", "cpu"),
            "fp16-decoder": ("fp32", "cpu", "fp16", "cuda"),
            "int8-encoder+fp16-decoder": ("int8", "cpu", "fp16", "cuda"),
            "fp16": ("fp16", "cuda", "fp16", "cuda"),
        }.items()
    }
    | {
        # fp16 decoded as on the CPU (growing shapes, a host read per row and block): the GPU path's baseline
        "fp16-dynamic-shapes": EngineOptions("fp16", "cuda", "fp16", "cuda", static_shapes=False),
        # static shapes without CUDA graphs: what the graphs add, apart
        "fp16-no-graphs": EngineOptions("fp16", "cuda", "fp16", "cuda", cuda_graphs=False),
        # fp16 with its log-mel features computed on the host, as on the CPU: what computing them on the GPU saves
        "fp16-host-features": EngineOptions("fp16", "cuda", "fp16", "cuda", features_on_device=False),
        # float32 on the GPU: the reference fp16's WER is held to (within 0.3 points)
        "fp32-gpu": EngineOptions("fp32", "cuda", "fp32", "cuda", projection_precision="fp32"),
    }
)


def cuda_available() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def cpu_has_native_bf16() -> bool:
    """Whether the engine's bf16 kernels multiply bf16 natively here (AMX tiles or AVX512-BF16, allowed by any
    oneDNN ISA cap, and a bf16 ``Linear`` actually runs): see :mod:`streamer.engine.kernels`."""
    from streamer.engine.kernels import KernelClass, kernel_report

    return kernel_report().kernel_class >= KernelClass.AVX512_BF16


def default_encoder_precision(cuda: bool) -> str:
    """fp16 on a GPU; on a CPU, the precision its kernel class calls for (:data:`~streamer.engine.kernels.
    DEFAULT_ENCODER`, from what torch's kernels run here, never from the CPU's flags alone)."""
    if cuda:
        return "fp16"
    from streamer.engine.kernels import kernel_report

    return kernel_report().default_encoder


def gpu_memory_allocated() -> int | None:
    """Bytes of GPU memory held by tensors on every CUDA device, or None when no engine uses a GPU.

    Cheap enough for every ``GET /metrics``: it never imports torch itself (an engine that uses the GPU already
    has), and never initialises CUDA (a CPU engine must not pay for a CUDA context).
    """
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return None
    return sum(int(torch.cuda.memory_allocated(device)) for device in range(torch.cuda.device_count()))


def load_engine(model: str = "tiny.en", options: EngineOptions | None = None) -> WhisperEngine:
    """Resolve, convert (once, cached), load and warm up ``model``. Blocks for seconds; call before serving.

    A precision the caller asked for that this CPU's kernels cannot run is refused with :class:`ConfigError`. A
    defaulted encoder precision that fails its warm-up (or, with ``warmup`` off, its probe: see
    :meth:`WhisperEngine.probe`) falls back to the INT8 encoder, with a warning in the log.
    """
    options = options or EngineOptions()
    options.validate()
    from streamer.engine.memory import configure_malloc
    from streamer.engine.models import prepare

    configure_malloc()
    files = prepare(model)
    _refuse_bf16_without_kernels(options)
    # each component where the caller put it, else on the GPU when there is one; the defaults below follow each
    # component's device, so an encoder placed on the CPU takes the CPU's default and its fallback on a GPU machine too
    default_device = "cuda" if cuda_available() else "cpu"
    options = replace(
        options,
        encoder_device=options.encoder_device or default_device,
        decoder_device=options.decoder_device or default_device,
    )
    if options.encoder_precision is not None or options.encoder_device != "cpu":
        return _build(files, options)
    encoder = default_encoder_precision(False)
    try:
        return _build(files, replace(options, encoder_precision=encoder))
    except RuntimeError as error:
        if encoder == "int8":
            raise
        log.warning(
            "the default %s encoder failed its %s on this CPU (%s); falling back to the INT8 encoder",
            encoder,
            "warm-up" if options.warmup else "probe",
            str(error).splitlines()[0],
        )
        return _build(files, replace(options, encoder_precision="int8"))


def _refuse_bf16_without_kernels(options: EngineOptions) -> None:
    for component in ("encoder", "decoder"):
        precision = getattr(options, f"{component}_precision")
        device = getattr(options, f"{component}_device") or "cpu"
        if precision == "bf16" and device == "cpu":
            from streamer.engine.kernels import bf16_linear_runs, onednn_cap

            if not bf16_linear_runs():
                cap = onednn_cap()[0]
                why = f" (ONEDNN_MAX_CPU_ISA={cap})" if cap else ""
                raise ConfigError(
                    f"{component} precision bf16: torch's bf16 kernels do not run on this CPU{why}; use int8 or fp32"
                )


def _build(files: ModelFiles, options: EngineOptions) -> WhisperEngine:
    """The engine for ``options`` whose devices :func:`load_engine` has resolved."""
    from streamer.engine.runtime import Placement, Precision
    from streamer.engine.weights import disabled_by_environment
    from streamer.engine.whisper import WhisperEngine
    from streamer.startup import resume_collection

    encoder_device = options.encoder_device or "cpu"
    decoder_device = options.decoder_device or "cpu"
    # fp32 on the CPU even where bf16 is native: a bf16 decoder is faster at the same WER, but rounds a batched
    # pass differently from single steps, so draft-verified decoding would no longer equal plain greedy decoding
    default_dec = "fp32" if decoder_device == "cpu" else "fp16"
    encoder_precision = options.encoder_precision or default_encoder_precision(encoder_device != "cpu")
    encoder = Placement(Precision(encoder_precision), encoder_device)
    decoder = Placement(Precision(options.decoder_precision or default_dec), decoder_device)
    engine = WhisperEngine(
        files,
        encoder,
        decoder,
        threads=options.threads,
        draft_decoding=options.draft_decoding,
        static_shapes=decoder_device != "cpu" if options.static_shapes is None else options.static_shapes,
        cuda_graphs=options.cuda_graphs,
        incremental_features=options.incremental_features,
        device_features=encoder_device != "cpu" if options.features_on_device is None else options.features_on_device,
        projection=None if options.projection_precision is None else Precision(options.projection_precision),
        weight_cache=options.weight_cache and not disabled_by_environment(),
    )
    if options.warmup:
        engine.warmup()
    else:
        engine.probe()
    resume_collection()  # the start-up's objects are made (a no-op unless the command paused the collector)
    return engine
