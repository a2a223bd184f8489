from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from streamer.core.errors import ModelFilesError
from streamer.engine.features import log_mel_spectrogram
from streamer.engine.models import prepare
from streamer.engine.network import _read_safetensors, _read_weights, blocked_attention, load_network
from tests.conftest import load_clip


def _sample() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return {
        "a.weight": torch.randn(7, 5, generator=generator),
        "b.half": torch.randn(3, 4, generator=generator).half(),
        "c.bf16": torch.randn(11, generator=generator).bfloat16(),
        "d.ids": torch.arange(6, dtype=torch.int64).view(2, 3),
        "e.empty": torch.empty(0, 4),
        "f.scalar": torch.tensor(2.5),
    }


def test_read_safetensors_matches_the_reference_reader_with_floats_in_float32(tmp_path: Path) -> None:
    path = tmp_path / "model.safetensors"
    save_file(_sample(), str(path), metadata={"format": "pt"})
    reference = load_file(str(path))
    read = _read_safetensors(path, torch.float32)
    assert read.keys() == reference.keys()
    for name, tensor in reference.items():
        expected = tensor.float() if tensor.is_floating_point() else tensor
        assert read[name].dtype == expected.dtype, name
        assert torch.equal(read[name], expected), name


def test_a_truncated_weights_file_is_a_model_files_error(tmp_path: Path) -> None:
    path = tmp_path / "model.safetensors"
    save_file(_sample(), str(path))
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(ModelFilesError, match="cannot read the weights"):
        _read_weights(tmp_path)


def test_the_network_holds_the_checkpoint_values_in_float32() -> None:
    directory = prepare("tiny.en").directory
    network = load_network(directory)
    reference = load_file(str(directory / "model.safetensors"))
    params = dict(network.named_parameters())
    for name in ("decoder.embed_tokens.weight", "encoder.layers.0.fc1.weight", "encoder.embed_positions.weight"):
        assert torch.equal(params[name], reference[f"model.{name}"].float()), name
    assert not any(p.is_meta for p in network.parameters())


def test_loading_the_network_neither_maps_the_weights_file_nor_imports_sympy() -> None:
    """A mapped weights file stays in the resident size while any tensor points into it; initialising an embedding
    on the meta device imports sympy (about 67 MB resident). A fresh interpreter, so no other test's state counts."""
    code = (
        "import sys\n"
        "from pathlib import Path\n"
        "from streamer.engine.models import prepare\n"
        "from streamer.engine.network import load_network\n"
        "files = prepare('tiny.en')\n"
        "network = load_network(files.directory)\n"
        "maps = Path('/proc/self/maps')\n"
        "mapped = maps.exists() and 'model.safetensors' in maps.read_text()\n"
        "print('sympy' in sys.modules, mapped)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=300)
    assert out.stdout.split() == ["False", "False"]


def test_the_encoder_reads_its_first_frames_and_refuses_more_or_odd_ones() -> None:
    network = load_network(prepare("tiny.en").directory)
    with torch.inference_mode():
        assert network.encoder(torch.zeros(1, 80, 600)).shape == (1, 300, 384)
        assert network.encoder(torch.zeros(1, 80, 3000)).shape == (1, 1500, 384)
        for frames in (601, 3002):
            with pytest.raises(ValueError, match="even number of feature frames, at most 3000"):
                network.encoder(torch.zeros(1, 80, frames))


@pytest.mark.parametrize(("batch", "time", "block"), [(1, 860, 256), (2, 300, 128), (1, 7, 256), (3, 513, 1)])
def test_blocked_attention_is_scaled_dot_product_attention(batch: int, time: int, block: int) -> None:
    """Blocks of queries, the last one short, each row's softmax over every key: in float32 what torch's fused
    kernel computes; in bf16 within bf16's rounding of the scores (checked against float64)."""
    generator = torch.Generator().manual_seed(time)
    q, k, v = (torch.randn(batch, 6, time, 64, generator=generator) for _ in range(3))
    expected = F.scaled_dot_product_attention(q.double(), k.double(), v.double())
    assert torch.allclose(blocked_attention(q, k, v, block).double(), expected, atol=1e-5)
    fused = F.scaled_dot_product_attention(q.bfloat16(), k.bfloat16(), v.bfloat16()).double()
    blocked = blocked_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), block).double()
    assert (blocked - expected).abs().max() < 0.05
    assert (blocked - fused).abs().mean() < 0.005
    with pytest.raises(ValueError, match="block"):
        blocked_attention(q, k, v, 0)


def test_the_encoder_with_blocked_attention_reads_a_window_as_with_the_fused_kernel() -> None:
    """The encoder's layers take the blocked path once their ``query_block`` is set: the same states over a real
    window (float32, where both paths compute the same sums)."""
    network = load_network(prepare("tiny.en").directory)
    features = log_mel_spectrogram([load_clip("1089-134686-0000.flac")[: 8 * 16000]])[:, :, :800]
    with torch.inference_mode():
        fused = network.encoder(features)
        for layer in network.encoder.layers:
            layer.self_attn.query_block = 128
        blocked = network.encoder(features)
    assert torch.allclose(blocked, fused, atol=1e-4)
