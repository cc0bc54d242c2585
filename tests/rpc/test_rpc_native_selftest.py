"""The protocol core alone, in C, under AddressSanitizer, UndefinedBehaviorSanitizer and
LeakSanitizer: exactly one response per request with loss, duplication, reordering and
garbage, then every allocation freed. No Python in the process, so a report points at
native/mr_core.c."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
NATIVE = HERE.parents[1] / "native"


def test_core_selftest_under_sanitizers(tmp_path: Path) -> None:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    exe = tmp_path / "core_selftest"
    build = subprocess.run(
        [cc, "-std=c11", "-O1", "-g", "-fno-omit-frame-pointer",
         "-fsanitize=address,undefined", "-fno-sanitize-recover=undefined",
         f"-I{NATIVE}", str(NATIVE / "mr_core.c"), str(NATIVE / "mr_hmac.c"), str(HERE / "core_selftest.c"), "-o", str(exe)],
        capture_output=True, text=True, check=False,
    )
    if build.returncode != 0 and "sanitize" in build.stderr:
        pytest.skip(f"compiler lacks sanitizer support: {build.stderr[-300:]}")
    assert build.returncode == 0, build.stderr
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    env["ASAN_OPTIONS"] = "detect_leaks=1:abort_on_error=0"
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120, env=env,
                         check=False)
    assert run.returncode == 0, (run.stdout + run.stderr)[-3000:]
    assert run.stdout.startswith("ok ")
