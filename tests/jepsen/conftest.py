"""Shared fixtures for the checker tests: where the external Jepsen test vectors live."""

from __future__ import annotations

from pathlib import Path

import pytest

REPOSITORY_ROOT = Path(__file__).resolve().parents[2]
VECTORS = REPOSITORY_ROOT.parent / "shared" / "test-vectors" / "jepsen-histories"


@pytest.fixture
def vectors() -> Path:
    """The folder of real Jepsen histories with known verdicts (see its README.md)."""
    if not VECTORS.is_dir():
        pytest.skip(f"Jepsen test vectors not found at {VECTORS} (they live beside the clone)")
    return VECTORS
