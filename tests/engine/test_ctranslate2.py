from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

from streamer.core.errors import ModelFilesError
from streamer.engine.ctranslate2 import hf_config_dict, read_model_bin, read_model_bin_parts, to_hf_state_dict
from streamer.engine.models import resolve


def _string(text: str) -> bytes:
    data = text.encode() + b"\0"
    return struct.pack("<H", len(data)) + data


def _variable(name: str, array: np.ndarray, dtype_id: int) -> bytes:
    raw = array.tobytes()
    dims = b"".join(struct.pack("<I", d) for d in array.shape)
    return _string(name) + bytes([array.ndim]) + dims + bytes([dtype_id]) + struct.pack("<I", len(raw)) + raw


def _model_bin(variables: list[bytes], aliases: list[tuple[str, str]] = (), spec: str = "WhisperSpec") -> bytes:
    head = struct.pack("<I", 6) + _string(spec) + struct.pack("<I", 3) + struct.pack("<I", len(variables))
    tail = struct.pack("<I", len(aliases)) + b"".join(_string(a) + _string(t) for a, t in aliases)
    return head + b"".join(variables) + tail


@pytest.fixture(scope="module")
def tiny_bin() -> Path:
    return resolve("tiny.en").bin_parts[0]


def test_tiny_en_maps_onto_every_transformers_parameter(tiny_bin: Path) -> None:
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    ct2 = read_model_bin(tiny_bin)
    assert ct2.spec == "WhisperSpec"
    state = to_hf_state_dict(ct2)
    config = hf_config_dict(ct2, vocab_size=51864)
    assert (config["d_model"], config["encoder_layers"], config["decoder_attention_heads"]) == (384, 4, 6)
    reference = WhisperForConditionalGeneration(WhisperConfig(**config)).state_dict()
    assert set(state) == set(reference)
    for name, tensor in reference.items():
        assert tuple(state[name].shape) == tuple(tensor.shape), name
    # the projection is an alias of the token embeddings in model.bin
    assert np.array_equal(state["proj_out.weight"], state["model.decoder.embed_tokens.weight"])


def test_fused_qkv_is_split_in_q_k_v_order(tiny_bin: Path) -> None:
    ct2 = read_model_bin(tiny_bin)
    fused = ct2.get("decoder/layer_0/self_attention/linear_0/weight")
    state = to_hf_state_dict(ct2)
    assert np.array_equal(state["model.decoder.layers.0.self_attn.q_proj.weight"], fused[:384])
    assert np.array_equal(state["model.decoder.layers.0.self_attn.k_proj.weight"], fused[384:768])
    assert np.array_equal(state["model.decoder.layers.0.self_attn.v_proj.weight"], fused[768:])
    assert "model.decoder.layers.0.self_attn.k_proj.bias" not in state  # Whisper's k_proj has no bias


def test_int8_weights_are_dequantized_per_row(tmp_path: Path) -> None:
    weight = np.array([[10, -20], [30, 40]], dtype=np.int8)
    scale = np.array([2.0, 10.0], dtype=np.float32)
    path = tmp_path / "model.bin"
    path.write_bytes(
        _model_bin([_variable("encoder/x/weight", weight, 1), _variable("encoder/x/weight_scale", scale, 0)])
    )
    model = read_model_bin(path)
    assert np.allclose(model.get("encoder/x/weight"), [[5.0, -10.0], [3.0, 4.0]])
    assert "encoder/x/weight_scale" not in model.variables


def test_float16_and_bfloat16_widen_to_float32(tmp_path: Path) -> None:
    half = np.array([1.5, -2.0], dtype=np.float16)
    bf16 = (np.array([3.0, 0.5], dtype=np.float32).view(np.uint32) >> 16).astype(np.uint16)
    path = tmp_path / "model.bin"
    path.write_bytes(_model_bin([_variable("a", half, 4), _variable("b", bf16, 5)], aliases=[("c", "a")]))
    model = read_model_bin(path)
    assert model.get("a").tolist() == [1.5, -2.0]
    assert model.get("b").tolist() == [3.0, 0.5]
    assert model.get("c").tolist() == [1.5, -2.0]


def test_parts_concatenate_in_order(tmp_path: Path) -> None:
    blob = _model_bin([_variable("a", np.arange(6, dtype=np.float32), 0)])
    (tmp_path / "p1").write_bytes(blob[:13])
    (tmp_path / "p2").write_bytes(blob[13:])
    model = read_model_bin_parts([tmp_path / "p1", tmp_path / "p2"])
    assert model.get("a").tolist() == [0, 1, 2, 3, 4, 5]


@pytest.mark.parametrize(
    ("blob", "message"),
    [
        (_model_bin([_variable("a", np.zeros(4, np.float32), 0)])[:-9], "truncated"),
        (_model_bin([], spec="TransformerSpec"), "not a Whisper model"),
        (struct.pack("<I", 99), "unsupported CTranslate2 format version"),
    ],
)
def test_unreadable_files_raise_one_clear_error(tmp_path: Path, blob: bytes, message: str) -> None:
    path = tmp_path / "model.bin"
    path.write_bytes(blob)
    with pytest.raises(ModelFilesError, match=message):
        read_model_bin(path)


def test_missing_part_is_named(tmp_path: Path) -> None:
    with pytest.raises(ModelFilesError, match="missing"):
        read_model_bin_parts([tmp_path / "model.bin.part1"])
