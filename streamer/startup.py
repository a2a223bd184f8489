"""A model-loading process's start-up: Python's cyclic garbage collector paused until the model is ready, and in a
one-shot command, torch imported without its meta registrations.

Importing torch and building the network make about a million objects that live as long as the process, and the
collector traced them all three times over on the way: 0.2 s of a 2.3 s ``streamer transcribe`` of one 15 s file
(measured with ``gc.callbacks`` on 2 cores). :func:`pause_collection` runs first thing in a command that loads a
model (``streamer.cli.main.entry``); :func:`resume_collection`, once the engine is loaded
(:func:`streamer.engine.load_engine`), freezes what start-up made, so no later collection traces it again either (a
server's periodic full collections included), and turns the collector back on.

A one-shot command (``streamer transcribe``, ``streamer eval``) also defers torch's meta registrations
(:func:`defer_meta_registrations`): a quarter of torch's import that a command running eager CPU kernels never uses.
One thing outside torch's imports needs them: ``torch.Generator()`` (see
:func:`streamer.engine.decoding.seeded_generator`).

This module imports nothing heavy, so that the pause and the deferral come before torch's import.
"""

from __future__ import annotations

import gc
import importlib
import importlib.machinery
import importlib.util
import sys
import types
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from importlib.abc import Loader

__all__ = ["META_REGISTRATIONS", "defer_meta_registrations", "pause_collection", "resume_collection"]

# The module torch's ``__init__`` imports last, for its side effects alone: it registers Python "meta" kernels (shapes
# and dtypes without data) for the operators whose C++ kernels lack one, for torch.compile, torch.export and fake
# tensors, and it pulls in torch._prims, torch._refs and torch._decomp on the way. 0.25 s of a 0.95 s ``import torch``
# on 2 Zen 4 cores (torch 2.13, ``python -X importtime``), where faster-whisper's whole import is 0.2 s. The engine runs
# eager CPU kernels; the meta device it builds the network on (streamer.engine.network) needs only the C++ kernels.
META_REGISTRATIONS = "torch._meta_registrations"

_paused = False  # pause_collection turned the collector off and resume_collection has not turned it back on


def pause_collection() -> None:
    """Turn the collector off until :func:`resume_collection`; one that is already off stays as it is."""
    global _paused
    if gc.isenabled():
        gc.disable()
        _paused = True


def resume_collection() -> bool:
    """If :func:`pause_collection` turned the collector off: freeze every object alive now (the permanent generation,
    which collections skip) and turn it back on. Returns whether it did."""
    global _paused
    if not _paused:
        return False
    gc.freeze()
    gc.enable()
    _paused = False
    return True


class _Deferred(types.ModuleType):
    """Stands in for :data:`META_REGISTRATIONS` while torch imports (torch binds it as ``torch._meta_registrations``
    and never reads it). A name read from it comes from the real module, imported there and then."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):  # the import system's probes (__path__, __file__, ...): a plain module has none
            raise AttributeError(name)
        return getattr(importlib.import_module(META_REGISTRATIONS), name)


class _Deferral:
    """The ``sys.meta_path`` finder that carries one deferral through, in three steps:

    1. torch's import: the stand-in is in ``sys.modules``, so torch's ``__init__`` skips the registrations; the
       moment it has run, the stand-in leaves ``sys.modules``.
    2. Public ``torch.*`` modules imported later (the engine's ``torch.utils.*``) load as usual; the first private one
       (``torch._*``: the registrations themselves, torch.compile's ``torch._dynamo``, ``torch._decomp``, ...) loads
       through :class:`_AfterRegistrations`, which imports the registrations first, in torch's own order.
    3. Then it leaves ``sys.meta_path``: everything after imports as it would have.
    """

    def __init__(self) -> None:
        self.torch_imported = False
        self.done = False  # the registrations are imported (or importing): the finder only waits to leave

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if self.done:
            return None
        if fullname == "torch" and not self.torch_imported:
            return self._torch(fullname, path, target)
        if self.torch_imported and fullname.startswith("torch._"):
            spec = self._next_spec(fullname, path, target)
            if spec is None or spec.loader is None:
                return spec
            self.done = True
            return importlib.machinery.ModuleSpec(fullname, cast("Loader", _AfterRegistrations(spec, self)))
        return None

    def _next_spec(
        self, fullname: str, path: Sequence[str] | None, target: types.ModuleType | None
    ) -> importlib.machinery.ModuleSpec | None:
        """The spec the finders after this one give (this one stays in ``sys.meta_path``: the import system is
        iterating it)."""
        finders = sys.meta_path[sys.meta_path.index(self) + 1 :] if self in sys.meta_path else sys.meta_path
        for finder in finders:
            find = getattr(finder, "find_spec", None)
            spec: importlib.machinery.ModuleSpec | None = None if find is None else find(fullname, path, target)
            if spec is not None:
                return spec
        return None

    def _torch(
        self, fullname: str, path: Sequence[str] | None, target: types.ModuleType | None
    ) -> importlib.machinery.ModuleSpec | None:
        spec = self._next_spec(fullname, path, target)
        loader = None if spec is None else spec.loader
        if loader is None:  # no torch to import: nothing to defer
            self.leave()
            return spec
        run = loader.exec_module

        def exec_module(module: types.ModuleType) -> None:
            try:
                run(module)
            finally:
                del loader.exec_module  # back to its class's own
                if isinstance(sys.modules.get(META_REGISTRATIONS), _Deferred):
                    del sys.modules[META_REGISTRATIONS]
                self.torch_imported = True

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec

    def leave(self) -> None:
        self.done = True
        if isinstance(sys.modules.get(META_REGISTRATIONS), _Deferred):
            del sys.modules[META_REGISTRATIONS]
        if self in sys.meta_path:
            sys.meta_path.remove(self)


class _AfterRegistrations:
    """The loader of the first private torch module imported after torch: the registrations first (which may import
    this very module on the way, as torch's ``__init__`` would have), then this module, once."""

    def __init__(self, spec: importlib.machinery.ModuleSpec, deferral: _Deferral) -> None:
        self.spec = spec  # what the real finders gave
        self.deferral = deferral
        self.own: importlib.machinery.ModuleSpec | None = None  # the spec of a module the registrations loaded

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        self.deferral.leave()
        importlib.import_module(META_REGISTRATIONS)
        module = sys.modules.get(spec.name)
        if module is not None:  # loaded on the way: hand that one back, not a second copy
            self.own = module.__spec__
            return module
        return importlib.util.module_from_spec(self.spec)

    def exec_module(self, module: types.ModuleType) -> None:
        module.__spec__ = self.own or self.spec  # the import system set it to the stand-in spec: put it back
        if self.own is None:
            assert self.spec.loader is not None  # find_spec returned no spec without one
            self.spec.loader.exec_module(module)


def defer_meta_registrations() -> bool:
    """Call before anything imports torch, in a process that will run torch's eager kernels: torch's import then
    skips :data:`META_REGISTRATIONS`, which registers its kernels when the process first imports a private torch
    module (``torch._*``) or reads a name from ``torch._meta_registrations`` (:class:`_Deferral`). Returns whether it
    deferred: not when torch or the registrations are imported already."""
    if "torch" in sys.modules or META_REGISTRATIONS in sys.modules:
        return False
    sys.modules[META_REGISTRATIONS] = _Deferred(META_REGISTRATIONS)
    sys.meta_path.insert(0, _Deferral())
    return True
