"""The engine's weights as placed (cast, quantized), cached on disk so that the next process loads them as they are.

Loading a model does more than read it: the float32 checkpoint is cast to the encoder's precision, the INT8 layers are
quantized, and the vocabulary projection is quantized row by row (:mod:`streamer.engine.projection`). That is most of
:class:`~streamer.engine.runtime.WhisperRuntime`'s construction, paid again by every ``streamer transcribe``. The
first process writes the placed tensors to ``cache_root()/weights/`` (see :func:`~streamer.engine.models.cache_root`);
later ones read them into modules built on the meta device, with nothing to convert (issue 19).

- The file is named by everything its tensors depend on (:func:`cache_file`): the model's files (name, size and
  modification time), each component's precision and device, the projection's precision, the torch version, the
  kernel class and :data:`FORMAT`. Anything else gives another name, so a stale file is never read; writing a
  new file removes the others of the same model and placement.
- It is written to a temporary name and renamed into place, so a reader sees a whole file or none, and read with
  ``torch.load(weights_only=True)``: tensors, dtypes and containers only, no code.
- A file that cannot be read, or whose tensors do not fit the modules (truncated, edited, a bug), is reported in the
  log and rebuilt from the checkpoint; a cache folder that cannot be written only costs the next process the build.
- INT8 layers are stored as their quantized weight and float bias, not as fbgemm's packed matrices (whose layout
  depends on the CPU), and are packed again on load. The encoder's are packed on a thread of their own
  (:func:`on_a_thread`; the packing releases the GIL) while the tokenizer loads, and the engine's first use of the
  encoder waits for them.
- ``STREAMER_WEIGHT_CACHE=0`` (or ``EngineOptions(weight_cache=False)``, ``--no-weight-cache``) turns it off. CUDA
  placements are never cached.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
import threading
import warnings
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from streamer.engine.models import ModelFiles, cache_root

__all__ = [
    "ENVIRONMENT",
    "FORMAT",
    "Int8Weight",
    "cache_file",
    "check_int8_weight",
    "disabled_by_environment",
    "dynamic_linear",
    "int8_skeleton",
    "on_a_thread",
    "read",
    "restore",
    "take_int8_weight",
    "tensors_of",
    "write",
]

log = logging.getLogger(__name__)

# bump when what a cache file holds, or how the engine places weights, changes: every older file is then ignored
FORMAT = "2"
# set to 0 (or false, no, off) to neither read nor write the cache
ENVIRONMENT = "STREAMER_WEIGHT_CACHE"
_QWEIGHT, _QBIAS = "qweight", "qbias"  # an INT8 layer's entries, under its module name


def disabled_by_environment(environ: dict[str, str] | None = None) -> bool:
    """Whether :data:`ENVIRONMENT` turns the cache off."""
    value = (os.environ if environ is None else environ).get(ENVIRONMENT, "")
    return value.strip().lower() in ("0", "false", "no", "off")


def cache_file(files: ModelFiles, placement: str, kernel_class: str) -> Path:
    """Where the weights of ``files`` placed as ``placement`` (``encoder bf16/cpu, decoder fp32/cpu, projection
    int8``, say) are cached on this machine: ``cache_root()/weights/MODEL-PLACEMENT-IDENTITY.pt``."""
    digest = hashlib.sha256(f"{FORMAT}\n{placement}\n{torch.__version__}\n{kernel_class}\n".encode())
    for path in sorted(files.directory.iterdir()):
        if path.is_file():
            stat = path.stat()
            digest.update(f"{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}\n".encode())
    return cache_root() / "weights" / f"{_prefix(files, placement)}{digest.hexdigest()[:16]}.pt"


def _prefix(files: ModelFiles, placement: str) -> str:
    words = f"{files.name}-{placement}".replace("/", "-").replace(",", "").split()
    return "".join(c if c.isalnum() or c in "._-" else "_" for c in "_".join(words)) + "-"


def read(path: Path) -> dict[str, Any] | None:
    """The tensors cached at ``path``; None when there is no file, or (with a log line) when it cannot be read."""
    try:
        with warnings.catch_warnings():  # torch's rebuild of quantized tensors still goes through TypedStorage
            warnings.filterwarnings("ignore", message="TypedStorage is deprecated", category=UserWarning)
            # ... and through the quantized-tensor constructors torch 2.13 deprecates (printed on every start)
            warnings.filterwarnings("ignore", message="torch.quantize_per_tensor", category=UserWarning)
            # mapped, not read: the tensors are copy-on-write views of the file's pages, faulted in as they are first
            # used (30 against 100 to 380 ms to load tiny.en's 113 MB; the file is only ever replaced, never rewritten
            # in place, so a mapping outlives a newer process's rewrite)
            tensors: dict[str, Any] = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except FileNotFoundError:
        return None
    except Exception as error:  # a truncated or foreign file: torch raises whatever its unpickler met
        log.warning("ignoring the weight cache %s, which cannot be read (%s); rebuilding it", path, error)
        return None
    if not isinstance(tensors, dict):
        log.warning("ignoring the weight cache %s, which holds no tensors; rebuilding it", path)
        return None
    return tensors


def write(path: Path, tensors: dict[str, Any]) -> None:
    """Cache ``tensors`` at ``path`` atomically, removing the files it replaces; a failure is logged, not raised."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path.parent, prefix=path.name, suffix=".tmp", delete=False) as file:
            temporary = Path(file.name)
            try:
                torch.save(tensors, file)
            except BaseException:
                temporary.unlink(missing_ok=True)
                raise
        os.replace(temporary, path)
    except OSError as error:
        log.warning("cannot write the weight cache %s (%s): the next load converts the weights again", path, error)
        return
    prefix = path.name[: path.name.rindex("-") + 1]
    for other in path.parent.glob(f"{prefix}*.pt"):
        if other != path and other.name[len(prefix) :].count("-") == 0:  # not a longer model name sharing the prefix
            other.unlink(missing_ok=True)


def dynamic_linear(in_features: int, out_features: int, bias: bool) -> Any:
    """An INT8 dynamic ``Linear`` (``torch.ao``'s, version 4: the reduce-range kernels ``quantize_dynamic`` gives)
    whose weight is set afterwards with ``set_weight_bias``. Built on a 1 x 1 placeholder, because the constructor
    packs a zero matrix of the full size, which for the vocabulary projection is tens of milliseconds of waste."""
    from torch.ao.nn.quantized.dynamic import Linear as DynamicLinear

    with warnings.catch_warnings():  # torch.ao's dynamic path is deprecated, not removed (see runtime.py)
        warnings.simplefilter("ignore")
        layer = DynamicLinear(1, 1, bias_=bias, dtype=torch.qint8)  # type: ignore[no-untyped-call]
    layer.in_features, layer.out_features = in_features, out_features
    return layer


def _is_dynamic(module: nn.Module) -> bool:
    from torch.ao.nn.quantized.dynamic import Linear as DynamicLinear

    return isinstance(module, DynamicLinear)


def int8_skeleton(module: nn.Module, keep_float: tuple[str, ...]) -> nn.Module:
    """``module`` with each ``nn.Linear`` not named ``*keep_float`` swapped for an unset :func:`dynamic_linear` of
    its shape: the structure ``quantize_dynamic`` gives, for :func:`restore` to fill."""
    for name, child in list(module.named_modules()):
        for attribute, grandchild in list(child.named_children()):
            full = f"{name}.{attribute}" if name else attribute
            if type(grandchild) is nn.Linear and not full.endswith(keep_float):
                layer = dynamic_linear(grandchild.in_features, grandchild.out_features, grandchild.bias is not None)
                setattr(child, attribute, layer)
    return module


def tensors_of(module: nn.Module, prefix: str) -> dict[str, Any]:
    """Every tensor of ``module`` under ``prefix.``: parameters and buffers by name, and each INT8 layer's quantized
    weight and float bias (``NAME.qweight``, ``NAME.qbias``)."""
    out: dict[str, Any] = {}
    for name, child in module.named_modules():
        if _is_dynamic(child):
            weight, bias = child._weight_bias()
            out[f"{prefix}.{name}.{_QWEIGHT}"] = weight
            if bias is not None:
                out[f"{prefix}.{name}.{_QBIAS}"] = bias
    for name, tensor in [*module.named_parameters(), *module.named_buffers()]:
        out[f"{prefix}.{name}"] = tensor.detach()
    return out


def check_int8_weight(name: str, layer: Any, weight: Any) -> None:
    """Raise ValueError naming ``name`` unless ``weight`` is a qint8 matrix of INT8 ``layer``'s shape."""
    shape = (layer.out_features, layer.in_features)
    if not (isinstance(weight, torch.Tensor) and weight.dtype == torch.qint8 and tuple(weight.shape) == shape):
        raise ValueError(f"{name}: not a {list(shape)} qint8 weight")


def take_int8_weight(tensors: dict[str, Any], name: str, layer: Any) -> torch.Tensor:
    """Pop the quantized weight of INT8 ``layer`` (``name`` its full module name) from ``tensors``, checked by
    :func:`check_int8_weight`; ValueError if it is missing or does not fit."""
    key = f"{name}.{_QWEIGHT}"
    if key not in tensors:
        raise ValueError(f"no {key}")
    weight: torch.Tensor = tensors.pop(key)
    check_int8_weight(name, layer, weight)
    return weight


@dataclass(frozen=True)
class Int8Weight:
    """An INT8 layer and the checked weight and bias (from the cache) that :meth:`pack` gives it."""

    layer: Any
    weight: torch.Tensor
    bias: torch.Tensor | None

    def pack(self) -> None:
        """Set the layer's weight and bias: fbgemm packs them (releasing the GIL)."""
        self.layer.set_weight_bias(self.weight, self.bias)


def on_a_thread(jobs: Sequence[Callable[[], None]], name: str) -> list[Future[None]]:
    """Run ``jobs`` one after the other on a new thread; each one's Future is done when it has run (with the
    exception it raised, if it did). A job after a failed one still runs. The thread is not a daemon: a process
    that ends while it packs waits for it (a tenth of a second) at shutdown, where a daemon thread still inside
    torch's kernels would abort the process ("terminate called without an active exception")."""
    futures: list[Future[None]] = [Future() for _ in jobs]

    def run() -> None:
        for job, future in zip(jobs, futures, strict=True):
            try:
                job()
            except BaseException as error:  # handed to whoever waits on the job
                future.set_exception(error)
            else:
                future.set_result(None)

    threading.Thread(target=run, name=name, daemon=False).start()
    return futures


def restore(
    module: nn.Module, prefix: str, tensors: dict[str, Any], *, unpacked: list[Int8Weight] | None = None
) -> None:
    """Fill ``module`` (built on the meta device, INT8 layers from :func:`int8_skeleton`) with its tensors from
    ``tensors``, each checked against the shape and dtype the module expects; ValueError names the first misfit
    (the caller then rebuilds the weights from the checkpoint). With ``unpacked``, the INT8 layers' weights are
    checked and appended there for the caller to :meth:`~Int8Weight.pack`, not packed here."""

    def take(key: str) -> Any:
        if key not in tensors:
            raise ValueError(f"no {key}")
        return tensors.pop(key)

    for name, child in module.named_modules():
        if _is_dynamic(child):
            weight = take_int8_weight(tensors, f"{prefix}.{name}", child)
            bias_key = f"{prefix}.{name}.{_QBIAS}"
            bias = tensors.pop(bias_key) if bias_key in tensors else None
            shape = (child.out_features, child.in_features)
            has_bias = child._weight_bias()[1] is not None
            if (bias is not None) != has_bias or (bias is not None and tuple(bias.shape) != shape[:1]):
                raise ValueError(f"{prefix}.{name}: the bias does not fit")
            if unpacked is None:
                child.set_weight_bias(weight, bias)
            else:
                unpacked.append(Int8Weight(child, weight, bias))
    for name, expected in [*module.named_parameters(), *module.named_buffers()]:
        tensor = take(f"{prefix}.{name}")
        if not isinstance(tensor, torch.Tensor) or tensor.shape != expected.shape or tensor.dtype != expected.dtype:
            raise ValueError(f"{prefix}.{name}: expected {expected.dtype} {list(expected.shape)}")
        owner_name, _, attribute = name.rpartition(".")
        owner = module.get_submodule(owner_name)
        if attribute in owner._parameters:
            owner._parameters[attribute] = nn.Parameter(tensor, requires_grad=expected.requires_grad)
        else:
            owner._buffers[attribute] = tensor
