"""The RPC test suite again, against the extension built with AddressSanitizer and
UndefinedBehaviorSanitizer (docs/rpc.md, "Sanitizer build"), so CI runs it too. The build
happens in a copy of the sources in a temporary directory; the working tree's extension is
left alone. Any sanitizer report aborts the inner run and fails this test."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
INNER_RUN = "MERIDIAN_SANITIZED_RUN"
TIMEOUT_S = 600


def _libasan() -> str | None:
    cc = shutil.which("gcc")
    if cc is None:
        return None
    path = subprocess.run([cc, "-print-file-name=libasan.so"], capture_output=True, text=True,
                          check=False).stdout.strip()
    return path if path and os.path.isabs(path) and os.path.exists(path) else None


@pytest.mark.skipif(os.environ.get(INNER_RUN) == "1", reason="this is the sanitized run")
def test_rpc_suite_under_asan_and_ubsan(tmp_path: Path) -> None:
    libasan = _libasan()
    if libasan is None:
        pytest.skip("gcc with libasan is not available")
    tree = tmp_path / "tree"
    tree.mkdir()
    for name in ("setup.py", "pyproject.toml"):
        shutil.copy(REPO / name, tree / name)
    shutil.copytree(REPO / "native", tree / "native")
    shutil.copytree(REPO / "store" / "rpc", tree / "store" / "rpc",
                    ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    shutil.copytree(REPO / "tests" / "rpc", tree / "tests" / "rpc",
                    ignore=shutil.ignore_patterns("__pycache__"))
    (tree / "tests" / "__init__.py").write_text("")
    env = {**os.environ, "MERIDIAN_SANITIZE": "1"}
    build = subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"],
                           cwd=tree, env=env, capture_output=True, text=True, check=False,
                           timeout=TIMEOUT_S)
    assert build.returncode == 0, build.stderr[-3000:]
    env = {**os.environ, INNER_RUN: "1", "PYTHONPATH": str(tree), "LD_PRELOAD": libasan,
           "ASAN_OPTIONS": "detect_leaks=0", "UBSAN_OPTIONS": "print_stacktrace=1"}
    where = subprocess.run(
        [sys.executable, "-c", "import store.rpc._native as n; print(n.__file__)"],
        cwd=tree, env=env, capture_output=True, text=True, check=False)
    assert where.stdout.strip().startswith(str(tree)), where.stdout + where.stderr
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/rpc"],
        cwd=tree, env=env, capture_output=True, text=True, check=False, timeout=TIMEOUT_S)
    output = run.stdout + run.stderr
    assert run.returncode == 0, output[-4000:]
    assert "AddressSanitizer" not in output and "runtime error" not in output, output[-4000:]
