"""The layer contract (``[tool.importlinter]`` in pyproject.toml): the package keeps it, and the contract would catch
an import that crosses a line (core into engine, engine into server, server into integrations, ...)."""

from __future__ import annotations

import itertools
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CONTRACT = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]


def lint_imports(config: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-c", "from importlinter.cli import lint_imports_command; lint_imports_command()"]
    return subprocess.run([*command, str(config), "--no-cache"], cwd=cwd, capture_output=True, text=True, check=False)


def test_the_package_keeps_its_layer_contract() -> None:
    result = lint_imports(ROOT / "pyproject.toml", ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 kept, 0 broken" in result.stdout


def layered_copy(tmp_path: Path) -> tuple[Path, list[str]]:
    """A package ``layered`` with one module per layer of the contract, each importing the layer below (allowed),
    and a config holding the project's own layers, renamed."""
    (contract,) = CONTRACT["contracts"]
    layers = [layer.replace("streamer.", "layered.") for layer in contract["layers"]]
    modules = [name.strip() for layer in layers for name in layer.split("|")]
    for module in modules:
        package = tmp_path.joinpath(*module.split("."))
        package.mkdir(parents=True)
        (package / "__init__.py").write_text("")
    (tmp_path / "layered" / "__init__.py").write_text("")
    for upper, lower in itertools.pairwise(layers):
        for name in upper.split("|"):
            below = lower.split("|")[0].strip()
            tmp_path.joinpath(*name.strip().split("."), "uses.py").write_text(f"import {below}\n")
    config = tmp_path / "contract.toml"
    quoted = ", ".join(f'"{layer}"' for layer in layers)
    config.write_text(
        f'[tool.importlinter]\nroot_package = "layered"\n\n[[tool.importlinter.contracts]]\nname = "layers"\n'
        f'type = "layers"\nlayers = [{quoted}]\n'
    )
    return config, modules


def test_a_layered_package_that_imports_downwards_keeps_the_contract(tmp_path: Path) -> None:
    config, _ = layered_copy(tmp_path)
    result = lint_imports(config, tmp_path)
    assert result.returncode == 0, result.stdout


@pytest.mark.parametrize(
    ("lower", "upper"),
    [
        ("core", "engine"),
        ("engine", "server"),
        ("server", "integrations"),
        ("integrations", "app"),
        ("core", "cli"),
        ("offline", "cli"),
        ("server", "offline"),
    ],
)
def test_an_import_that_crosses_a_line_breaks_the_contract(tmp_path: Path, lower: str, upper: str) -> None:
    config, modules = layered_copy(tmp_path)
    assert f"layered.{lower}" in modules and f"layered.{upper}" in modules
    tmp_path.joinpath("layered", lower, "reaches_up.py").write_text(f"from layered.{upper} import uses\n")
    result = lint_imports(config, tmp_path)
    assert result.returncode != 0
    assert f"layered.{lower} is not allowed to import layered.{upper}" in result.stdout
