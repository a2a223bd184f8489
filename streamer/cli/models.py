"""``streamer models``: the bundled models and whether each is installed (``list``, the default), or one model written
as a transformers-format directory (``export NAME DIR``); :mod:`streamer.engine.models` finds them."""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from streamer.core.errors import ConfigError
from streamer.engine.models import BUNDLED_MODELS, DEFAULT_MODEL, available_models, prepare

__all__ = ["configure_parser", "run"]


def configure_parser(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="models_command", metavar="ACTION")
    sub.add_parser("list", help="list the bundled models and whether they are installed (the default)")
    export = sub.add_parser("export", help="write a model as a transformers-format directory")
    export.add_argument("name", help="model name, directory or Hugging Face id")
    export.add_argument("directory", type=Path, help="output directory (created; must be empty if it exists)")


def run(args: argparse.Namespace) -> int:
    if getattr(args, "models_command", None) == "export":
        target: Path = args.directory
        if target.exists() and (not target.is_dir() or any(target.iterdir())):
            raise ConfigError(f"{target} exists and is not an empty directory")
        files = prepare(args.name)
        shutil.copytree(files.directory, target, dirs_exist_ok=True)
        print(f"exported {args.name} to {target}")
        return 0
    width = max(len(m.name) for m in BUNDLED_MODELS.values())
    for listing in available_models():
        mark = "installed" if listing.installed else "missing  "
        default = " (default)" if listing.name == DEFAULT_MODEL else ""
        print(f"{listing.name:<{width}}  {mark}  {listing.description}{default}", file=sys.stdout)
        print(f"{'':<{width}}             {listing.location}")
    print("Also accepted: a CTranslate2 or transformers model directory, or a Hugging Face id in the local cache.")
    return 0
