"""DESIGN.md §7: the cores (``store/core``, and the wire protocol ``store/protocol``) never
import I/O, clocks, randomness or threads."""

from __future__ import annotations

import ast

from tests.conftest import REPO

BANNED = {"asyncio", "socket", "grpc", "time", "random", "threading", "os"}
# The packages under store/ that must stay pure.
PURE_PACKAGES = ("core", "protocol")


def banned_imports(source: str) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        else:
            continue
        found += [name for name in names if name.split(".")[0] in BANNED]
    return found


def test_store_core_and_protocol_import_no_io_clock_or_randomness() -> None:
    modules = []
    for package in PURE_PACKAGES:
        found = sorted((REPO / "store" / package).rglob("*.py"))
        assert found, f"store/{package} has no modules"
        modules += found
    offenders = {
        str(path.relative_to(REPO)): hits
        for path in modules
        if (hits := banned_imports(path.read_text()))
    }
    assert offenders == {}


def test_the_purity_check_catches_each_banned_module() -> None:
    for name in sorted(BANNED):
        assert banned_imports(f"import {name}") == [name]
        assert banned_imports(f"from {name} import x") == [name]
        assert banned_imports(f"import {name}.sub as y") == [f"{name}.sub"]
    assert banned_imports("import store.core.vclock\nfrom collections import deque") == []
