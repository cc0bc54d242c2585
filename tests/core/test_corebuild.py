"""Which build of store.core a process runs (store/corebuild.py, docs/performance.md): the
compiled one only when every source file is the one it was compiled from, the source when
asked (MERIDIAN_PURE_PYTHON=1) or when a file changed since the build."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import store.core
from store.corebuild import MANIFEST, PURE_ENV
from tests.conftest import REPO

# The RPC endpoint and the codec first: they are compiled with the core, and importing them
# before store.core must choose the build all the same (store/__init__.py chooses it).
PROBE = (
    "import json, store.rpc.endpoint as e, store.protocol.codec as c, store.core, "
    "store.core.participant as p; "
    "print(json.dumps([store.core.compiled(), p.__file__, [c.__file__, e.__file__]]))"
)


def probe(root: Path, env: dict[str, str] | None = None) -> tuple[bool, str, str]:
    """(compiled, the participant module's file, stderr) of a fresh process importing the
    ``store`` package found under ``root``; the RPC endpoint and the codec, imported first,
    run the same build."""
    import json

    environment = {k: v for k, v in os.environ.items() if k != PURE_ENV} | (env or {})
    environment["PYTHONPATH"] = str(root)
    done = subprocess.run(
        [sys.executable, "-c", PROBE], env=environment, cwd=root, capture_output=True,
        text=True, check=True, timeout=120,
    )
    compiled, path, others = json.loads(done.stdout)
    for other in others:
        assert other.endswith(".py") == path.endswith(".py"), (other, path)
    return compiled, path, done.stderr


needs_build = pytest.mark.skipif(
    not MANIFEST.exists(), reason="the package was built without compiling the core"
)


def test_asked_for_the_source_every_core_module_runs_from_its_py_file() -> None:
    compiled, path, _ = probe(REPO, {PURE_ENV: "1"})
    assert not compiled
    assert path.endswith("store/core/participant.py")


@needs_build
def test_the_build_runs_compiled_when_its_sources_are_unchanged() -> None:
    assert store.core.compiled() or os.environ.get(PURE_ENV) == "1"
    compiled, path, stderr = probe(REPO)
    assert compiled and not path.endswith(".py"), path
    assert "run from source" not in stderr


@needs_build
def test_a_source_changed_since_the_build_runs_the_whole_core_from_source(tmp_path: Path) -> None:
    copy = tmp_path / "store"
    shutil.copytree(REPO / "store", copy, ignore=shutil.ignore_patterns("__pycache__"))
    assert probe(tmp_path)[0], "an unchanged copy of the build runs compiled"
    vclock = copy / "core" / "vclock.py"
    vclock.write_text(vclock.read_text() + "\n# edited after the build\n")
    compiled, path, stderr = probe(tmp_path)
    # Not the compiled participant either: the compiled modules call one another directly.
    assert not compiled
    assert path == str(copy / "core" / "participant.py")
    assert "vclock.py changed since the compiled build" in stderr
