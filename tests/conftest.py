"""Shared test fixtures and paths."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared"


def pytest_collection_modifyitems(config: object, items: list[object]) -> None:
    """Tests marked ``patches_core`` break a rule on purpose by patching a class or function
    of a compiled module (``store.core``, ``store.protocol``, the host, the RPC core's
    Python side: setup.py), or hand one a scripted stand-in for a collaborator its
    annotations name, neither of which the compiled build (docs/performance.md) allows: they
    run only where those run from source, ``MERIDIAN_PURE_PYTHON=1`` (.ci/run's second
    pass); elsewhere they are skipped, saying so."""
    import pytest

    import store.core

    if not store.core.compiled():
        return
    skip = pytest.mark.skip(
        reason="patches store.core, which runs compiled here: run with MERIDIAN_PURE_PYTHON=1"
    )
    for item in items:
        if item.get_closest_marker("patches_core") is not None:  # type: ignore[attr-defined]
            item.add_marker(skip)  # type: ignore[attr-defined]
