"""``streamer bench offline``: the data sets it measures and the kernel classes ``--isa`` runs."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from streamer.bench.offline import ISA_CAPS, _classes, _items, _on_the_cpu, configure_parser
from streamer.core.errors import ConfigError
from streamer.engine.kernels import KernelClass, cpu_features


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    configure_parser(parser)
    return parser.parse_args(list(argv))


def test_every_class_has_caps_and_all_means_those_this_cpu_reaches() -> None:
    assert [KernelClass.parse(name) for name in ISA_CAPS] == sorted(KernelClass.parse(n) for n in ISA_CAPS)
    assert all(caps["CT2_FORCE_CPU_ISA"] in ("AVX2", "AVX512") for caps in ISA_CAPS.values())
    reachable = cpu_features().kernel_class
    assert _classes("all") == [n for n in ISA_CAPS if KernelClass.parse(n) <= reachable]
    assert _classes("avx2") == (["avx2"] if reachable >= KernelClass.AVX2 else [])
    with pytest.raises(ConfigError, match="unknown kernel class 'sse'"):
        _classes("avx2,sse")


def test_the_pooled_set_adds_the_english_long_form_files_only(shared_data: Path) -> None:
    librispeech = _items(parse())
    pooled = _items(parse("--set", "pooled"))
    assert len(librispeech) == 66
    added = [item.path.name for item in pooled[66:]]
    assert pooled[:66] == librispeech and len(added) == 3
    assert not any(name.endswith(("_de.mp3", "_es.mp3")) for name in added)
    assert len(_items(parse("--set", "pooled", "--limit", "5"))) == 5


def test_configurations_run_on_the_cpu_beside_faster_whisper_unless_they_name_a_device() -> None:
    """On a machine with a GPU the engine's own default is the GPU; this benchmark compares CPU engines."""
    from streamer.engine import CONFIGS

    default = _on_the_cpu(CONFIGS["default"])
    assert (default.encoder_device, default.decoder_device) == ("cpu", "cpu")
    assert default.encoder_precision == CONFIGS["default"].encoder_precision  # the CPU's default still applies
    split = _on_the_cpu(CONFIGS["int8-encoder+fp16-decoder"])
    assert (split.encoder_device, split.decoder_device) == ("cpu", "cuda")
