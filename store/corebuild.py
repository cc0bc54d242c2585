"""Which build of the compiled modules (``store.core``, ``store.protocol`` and the per-request
path around them, setup.py) this process runs: compiled or source (see
``store/core/__init__.py``). Run by ``store/__init__.py``; outside ``store.core`` because it
reads the environment and files, which the core itself never does (DESIGN.md §7)."""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

_HERE = Path(__file__).resolve().parent / "core"
MANIFEST = _HERE / "_compiled.txt"  # "<module> <sha256 of its source>" per line
PURE_ENV = "MERIDIAN_PURE_PYTHON"


def source_path(module: str) -> Path:
    """The ``.py`` file of a module of the ``store`` package, compiled or not."""
    return _HERE.parent.parent.joinpath(*module.split(".")).with_suffix(".py")


def source_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _why_source(digests: dict[str, str]) -> str | None:
    """Why this process must run the source although a compiled build is there (None:
    it need not). ``digests``: the manifest's, by module."""
    if os.environ.get(PURE_ENV) == "1":
        return f"{PURE_ENV}=1"
    for module, digest in digests.items():
        path = source_path(module)
        if not path.exists() or source_digest(path) != digest:
            return f"{path} changed since the compiled build; rebuild it: pip install -e ."
    return None


class _SourceFinder(importlib.abc.MetaPathFinder):
    """Imports the compiled modules of this package from their ``.py`` files."""

    def __init__(self, modules: set[str]) -> None:
        self.modules = modules

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in self.modules:
            return None
        return importlib.util.spec_from_file_location(fullname, source_path(fullname))


def choose_build() -> None:
    """Run once, by store/__init__.py, before any compiled module is imported."""
    if not MANIFEST.exists():
        return  # built without mypyc (or not built): the source is all there is
    digests = dict(line.split() for line in MANIFEST.read_text().splitlines())
    reason = _why_source(digests)
    if reason is None:
        return
    sys.meta_path.insert(0, _SourceFinder(set(digests)))
    if not reason.startswith(PURE_ENV):
        warnings.warn(
            "store.core, store.protocol and the modules compiled with them run from source: "
            f"{reason}",
            RuntimeWarning,
            stacklevel=2,
        )


def compiled() -> bool:
    """Whether this process runs the compiled core (imports one of its modules to see)."""
    from store.core import vclock

    return not (vclock.__file__ or "").endswith(".py")
