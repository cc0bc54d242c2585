"""README.md's SDK example works as written, against a real cluster."""

from __future__ import annotations

import re
import subprocess
import sys

from store.node.up import ProcessCluster
from tests.conftest import REPO


def readme_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", (REPO / "README.md").read_text(), re.S)


def test_the_sdk_example_prints_what_the_readme_says(cluster: ProcessCluster) -> None:
    example = next(block for block in readme_blocks() if "Client.connect" in block)
    assert len([line for line in example.splitlines() if line.strip()]) <= 12
    code = example.replace("cluster/local.toml", str(cluster.config.path))
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "[70, None]", "{'0': None, '1': None}", "[(('order', 1, 9), 'shipped')]",
    ]


def test_the_procedure_example_runs() -> None:
    example = next(block for block in readme_blocks() if "LocalCluster" in block)
    result = subprocess.run(
        [sys.executable, "-c", example], cwd=REPO, capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "70"
