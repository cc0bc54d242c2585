"""The SDK talks to a cluster through ``store.protocol`` alone: importing it loads no replica,
no configuration manager, no Paxos and no store (issue 12). Each check runs in a fresh
interpreter, so what other tests have imported cannot hide a stray import."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys

from tests.conftest import REPO

# What only servers run: none of it may be loaded by ``import store.client``.
SERVER_MODULES = (
    "store.core.replica",
    "store.core.follower",
    "store.core.coordinator",
    "store.core.participant",
    "store.core.cm",
    "store.core.paxos",
    "store.core.transfer",
    "store.core.storage",
    "store.core.watermark",
    "store.core.epoch",
    "store.core.ready",
    "store.node",
    "store.sim",
    "store.proto",
)
# The small pure value modules of the core that the protocol may use.
CORE_FOR_PROTOCOL = {
    "store.core",
    # The compiled build (docs/performance.md): which build runs, and the one shared library
    # that holds every compiled core module's code; a module of it is set up only when it is
    # imported, so loading it runs none of the replica's, the follower's or Paxos' code.
    "store.corebuild",
    "store.core._compiled__mypyc",
    "store.core.vclock",
    "store.core.errors",
    "store.core.settings",
    "store.core.partition",
    "store.core.keys",
    "store.core.values",
}


def modules_after(statement: str) -> list[str]:
    """The ``store`` modules loaded by ``statement`` in a fresh interpreter running this tree."""
    code = (
        f"{statement}\n"
        "import json, sys\n"
        "print(json.dumps(sorted(m for m in sys.modules if m == 'store' or m.startswith('store.'))))"
    )
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True,
        timeout=120, check=False,
    )
    assert done.returncode == 0, done.stderr
    loaded: list[str] = json.loads(done.stdout.strip().splitlines()[-1])
    return loaded


def within(name: str, packages: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in packages)


def test_importing_the_sdk_loads_no_server_module() -> None:
    loaded = modules_after("import store.client")
    assert "store.client" in loaded
    assert "store.protocol.codec" in loaded  # the check sees what the SDK really loads
    leaked = [name for name in loaded if within(name, SERVER_MODULES)]
    assert not leaked, f"import store.client loads {leaked}"


def test_the_protocol_loads_only_the_core_value_modules() -> None:
    loaded = modules_after(
        "import store.protocol.codec, store.protocol.messages, store.protocol.cluster_map,"
        " store.protocol.wirecheck"
    )
    others = [
        name for name in loaded
        if name != "store" and not within(name, ("store.protocol",))
    ]
    leaked = sorted(set(others) - CORE_FOR_PROTOCOL)
    assert not leaked, f"store.protocol loads {leaked}"


def test_no_protocol_module_imports_beyond_them_even_lazily() -> None:
    """Function-level imports run late, so the fresh interpreter above would miss them."""
    modules = sorted((REPO / "store" / "protocol").rglob("*.py"))
    assert modules, "store/protocol has no modules"
    offenders: dict[str, list[str]] = {}
    for path in modules:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
                if node.module in {"store", "store.core"}:  # from store.core import cm
                    names = [f"{node.module}.{alias.name}" for alias in node.names]
            elif isinstance(node, ast.ImportFrom):  # relative: name it by the package
                names = ["store.protocol"]
            else:
                continue
            bad = [
                name for name in names
                if within(name, ("store",))
                and not within(name, ("store.protocol",))
                and name not in CORE_FOR_PROTOCOL
            ]
            if bad:
                offenders.setdefault(str(path.relative_to(REPO)), []).extend(bad)
    assert offenders == {}
