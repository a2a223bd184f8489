"""Read CTranslate2 ``WhisperSpec`` model files and convert them to transformers' Whisper state dict.

The ``model.bin`` layout (little-endian), as written by CTranslate2's ``ModelSpec.save``:

* u32 format version (6), string spec name (``WhisperSpec``), u32 spec revision, u32 variable count;
* per variable: string name, u8 rank, ``rank`` x u32 dims, u8 dtype id, u32 byte count, raw data;
* u32 alias count, then (alias, target) string pairs.

A string is a u16 length that counts a trailing NUL, then the bytes with that NUL. dtype ids: 0 float32, 1 int8,
2 int16, 3 int32, 4 float16, 5 bfloat16. An int8 model stores ``<name>_scale`` beside each int8 weight (one scale per
output row: ``w = int8 / scale``).
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np
import numpy.typing as npt

from streamer.core.errors import ModelFilesError

__all__ = ["CT2Model", "hf_config_dict", "read_model_bin", "read_model_bin_parts", "to_hf_state_dict"]

_DTYPES: dict[int, np.dtype[np.generic]] = {
    0: np.dtype("<f4"),
    1: np.dtype("i1"),
    2: np.dtype("<i2"),
    3: np.dtype("<i4"),
    4: np.dtype("<f2"),
    5: np.dtype("<u2"),  # bfloat16: kept as raw 16-bit words, widened in _as_float32
}
_BFLOAT16 = 5


@dataclass(frozen=True)
class CT2Model:
    """The variables of a CTranslate2 Whisper model, aliases resolved, weights as float32 arrays."""

    spec: str
    revision: int
    variables: dict[str, npt.NDArray[np.generic]]

    def get(self, name: str) -> npt.NDArray[np.float32]:
        try:
            return _as_float32(self.variables[name])
        except KeyError:
            raise ModelFilesError(f"model.bin lacks the variable {name!r}: is this a Whisper model?") from None

    def scalar(self, name: str) -> int:
        return int(np.asarray(self.variables[name]).reshape(-1)[0])

    def layer_count(self, stack: str) -> int:
        count = 0
        while f"{stack}/layer_{count}/ffn/linear_0/weight" in self.variables:
            count += 1
        return count


def _as_float32(array: npt.NDArray[np.generic]) -> npt.NDArray[np.float32]:
    if array.dtype == np.dtype("<u2"):  # bfloat16 words: the high half of a float32
        return (array.astype(np.uint32) << 16).view(np.float32)
    return array.astype(np.float32)


class _Reader:
    def __init__(self, stream: BinaryIO, source: str) -> None:
        self._stream = stream
        self._source = source

    def take(self, count: int) -> bytes:
        data = self._stream.read(count)
        if len(data) != count:
            raise ModelFilesError(f"{self._source} is truncated: the file ends in the middle of a record")
        return data

    def u8(self) -> int:
        return self.take(1)[0]

    def u16(self) -> int:
        return int(struct.unpack("<H", self.take(2))[0])

    def u32(self) -> int:
        return int(struct.unpack("<I", self.take(4))[0])

    def string(self) -> str:
        length = self.u16()
        return self.take(length)[:-1].decode("utf-8")


class _ConcatStream:
    """A read-only file object over several files in order (a ``model.bin`` split into parts)."""

    def __init__(self, paths: list[Path]) -> None:
        self._files = [path.open("rb") for path in paths]
        self._index = 0

    def read(self, count: int) -> bytes:
        chunks: list[bytes] = []
        while count > 0 and self._index < len(self._files):
            chunk = self._files[self._index].read(count)
            if not chunk:
                self._index += 1
                continue
            chunks.append(chunk)
            count -= len(chunk)
        return b"".join(chunks)

    def close(self) -> None:
        for f in self._files:
            f.close()


def read_model_bin(path: Path) -> CT2Model:
    """Parse one ``model.bin``; raises :class:`ModelFilesError` when it is not a readable WhisperSpec file."""
    return read_model_bin_parts([path])


def read_model_bin_parts(paths: list[Path]) -> CT2Model:
    """Parse a ``model.bin`` stored as the concatenation of ``paths`` (in order)."""
    for path in paths:
        if not path.is_file():
            raise ModelFilesError(f"model file {path} is missing")
    stream = _ConcatStream(paths)
    source = str(paths[0]) if len(paths) == 1 else f"{paths[0]} (+{len(paths) - 1} parts)"
    try:
        return _parse(_Reader(stream, source), source)  # type: ignore[arg-type]
    finally:
        stream.close()


def _parse(reader: _Reader, source: str) -> CT2Model:
    version = reader.u32()
    if version < 5 or version > 6:
        raise ModelFilesError(f"{source}: unsupported CTranslate2 format version {version} (5 or 6 expected)")
    spec = reader.string()
    if spec != "WhisperSpec":
        raise ModelFilesError(f"{source} holds a {spec!r}, not a Whisper model")
    revision = reader.u32()
    variables: dict[str, npt.NDArray[np.generic]] = {}
    for _ in range(reader.u32()):
        name = reader.string()
        rank = reader.u8()
        dims = [reader.u32() for _ in range(rank)]
        dtype_id = reader.u8()
        nbytes = reader.u32()
        if dtype_id not in _DTYPES:
            raise ModelFilesError(f"{source}: variable {name!r} has unknown dtype id {dtype_id}")
        data = reader.take(nbytes)
        variables[name] = np.frombuffer(data, dtype=_DTYPES[dtype_id]).reshape(dims)
    for _ in range(reader.u32()):
        alias = reader.string()
        target = reader.string()
        variables[alias] = variables[target]
    return CT2Model(spec=spec, revision=revision, variables=_dequantize(variables))


def _dequantize(variables: dict[str, npt.NDArray[np.generic]]) -> dict[str, npt.NDArray[np.generic]]:
    """Turn int8/int16 weights with per-row ``weight_scale`` into float32 (``w / scale``)."""
    out = dict(variables)
    for name, scale in variables.items():
        if not name.endswith("weight_scale"):
            continue
        weight_name = name[: -len("_scale")]
        weight = variables[weight_name]
        scale32 = _as_float32(scale).reshape(-1, *([1] * (weight.ndim - 1)))
        out[weight_name] = weight.astype(np.float32) / scale32
        del out[name]
    return out


def hf_config_dict(model: CT2Model, vocab_size: int) -> dict[str, object]:
    """A transformers ``WhisperConfig`` dict describing ``model``'s dimensions."""
    d_model = model.get("encoder/conv1/weight").shape[0]
    return {
        "model_type": "whisper",
        "architectures": ["WhisperForConditionalGeneration"],
        "vocab_size": vocab_size,
        "num_mel_bins": model.get("encoder/conv1/weight").shape[1],
        "d_model": int(d_model),
        "encoder_layers": model.layer_count("encoder"),
        "decoder_layers": model.layer_count("decoder"),
        "encoder_attention_heads": model.scalar("encoder/num_heads"),
        "decoder_attention_heads": model.scalar("decoder/num_heads"),
        "encoder_ffn_dim": int(model.get("encoder/layer_0/ffn/linear_0/weight").shape[0]),
        "decoder_ffn_dim": int(model.get("decoder/layer_0/ffn/linear_0/weight").shape[0]),
        "max_source_positions": int(model.get("encoder/position_encodings/encodings").shape[0]),
        "max_target_positions": int(model.get("decoder/position_encodings/encodings").shape[0]),
        "activation_function": "gelu",
        "scale_embedding": False,
        "tie_word_embeddings": True,
    }


def _norm(model: CT2Model, src: str, dst: str) -> Iterator[tuple[str, npt.NDArray[np.float32]]]:
    yield f"{dst}.weight", model.get(f"{src}/gamma")
    yield f"{dst}.bias", model.get(f"{src}/beta")


def _linear(model: CT2Model, src: str, dst: str) -> Iterator[tuple[str, npt.NDArray[np.float32]]]:
    yield f"{dst}.weight", model.get(f"{src}/weight")
    if f"{src}/bias" in model.variables:
        yield f"{dst}.bias", model.get(f"{src}/bias")


def _split_linear(
    model: CT2Model, src: str, dsts: list[str], no_bias: set[str]
) -> Iterator[tuple[str, npt.NDArray[np.float32]]]:
    """A fused projection (rows concatenated in ``dsts`` order) split back into one linear per destination."""
    weights = np.split(model.get(f"{src}/weight"), len(dsts), axis=0)
    biases = np.split(model.get(f"{src}/bias"), len(dsts), axis=0)
    for dst, weight, bias in zip(dsts, weights, biases, strict=True):
        yield f"{dst}.weight", weight
        if dst not in no_bias:  # Whisper's k_proj has no bias; CTranslate2 stores zeros there
            yield f"{dst}.bias", bias


def _layer(model: CT2Model, stack: str, index: int) -> Iterator[tuple[str, npt.NDArray[np.float32]]]:
    src = f"{stack}/layer_{index}"
    dst = f"model.{stack}.layers.{index}"
    yield from _norm(model, f"{src}/self_attention/layer_norm", f"{dst}.self_attn_layer_norm")
    qkv = [f"{dst}.self_attn.{p}" for p in ("q_proj", "k_proj", "v_proj")]
    yield from _split_linear(model, f"{src}/self_attention/linear_0", qkv, {qkv[1]})
    yield from _linear(model, f"{src}/self_attention/linear_1", f"{dst}.self_attn.out_proj")
    if stack == "decoder":
        yield from _norm(model, f"{src}/attention/layer_norm", f"{dst}.encoder_attn_layer_norm")
        yield from _linear(model, f"{src}/attention/linear_0", f"{dst}.encoder_attn.q_proj")
        kv = [f"{dst}.encoder_attn.{p}" for p in ("k_proj", "v_proj")]
        yield from _split_linear(model, f"{src}/attention/linear_1", kv, {kv[0]})
        yield from _linear(model, f"{src}/attention/linear_2", f"{dst}.encoder_attn.out_proj")
    yield from _norm(model, f"{src}/ffn/layer_norm", f"{dst}.final_layer_norm")
    yield from _linear(model, f"{src}/ffn/linear_0", f"{dst}.fc1")
    yield from _linear(model, f"{src}/ffn/linear_1", f"{dst}.fc2")


def to_hf_state_dict(model: CT2Model) -> dict[str, npt.NDArray[np.float32]]:
    """Map CTranslate2 variable names onto ``WhisperForConditionalGeneration`` parameter names."""
    state: dict[str, npt.NDArray[np.float32]] = {}
    for index in (1, 2):
        state.update(_linear(model, f"encoder/conv{index}", f"model.encoder.conv{index}"))
    state["model.encoder.embed_positions.weight"] = model.get("encoder/position_encodings/encodings")
    for index in range(model.layer_count("encoder")):
        state.update(_layer(model, "encoder", index))
    state.update(_norm(model, "encoder/layer_norm", "model.encoder.layer_norm"))
    state["model.decoder.embed_tokens.weight"] = model.get("decoder/embeddings/weight")
    state["model.decoder.embed_positions.weight"] = model.get("decoder/position_encodings/encodings")
    for index in range(model.layer_count("decoder")):
        state.update(_layer(model, "decoder", index))
    state.update(_norm(model, "decoder/layer_norm", "model.decoder.layer_norm"))
    state["proj_out.weight"] = state["model.decoder.embed_tokens.weight"]
    return {name: np.ascontiguousarray(value) for name, value in state.items()}


def read_ct2_config(directory: Path) -> dict[str, object]:
    """The ``config.json`` of a CTranslate2 Whisper directory (alignment heads, suppress ids)."""
    path = directory / "config.json"
    if not path.is_file():
        return {}
    try:
        loaded = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise ModelFilesError(f"{path} is not valid JSON: {error}") from None
    return loaded if isinstance(loaded, dict) else {}
