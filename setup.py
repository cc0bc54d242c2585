"""Build of Meridian's C extensions: the RPC protocol core (native/, docs/rpc.md), and the
protocol cores of ``store.core`` with the per-request path around them compiled by mypyc
(docs/performance.md).

Everything else about the package lives in pyproject.toml. Set MERIDIAN_SANITIZE=1 to build
the RPC extension with AddressSanitizer and UndefinedBehaviorSanitizer (see docs/rpc.md for
how to load it into Python). Set MERIDIAN_COMPILE_CORE=0 to leave ``store.core`` as source
(it then runs about 1.5 times slower).
"""

import hashlib
import os
from pathlib import Path

from setuptools import Extension, setup

compile_args = ["-O2", "-std=c11", "-Wall", "-Wextra", "-Wno-missing-field-initializers"]
link_args: list[str] = []
if os.environ.get("MERIDIAN_SANITIZE") == "1":
    sanitize = ["-fsanitize=address,undefined", "-fno-sanitize-recover=undefined",
                "-fno-omit-frame-pointer", "-g"]
    compile_args = [*compile_args, *sanitize]
    link_args = [*link_args, *sanitize]

extensions = [
    Extension(
        "store.rpc._native",
        sources=["native/mr_core.c", "native/mr_hmac.c", "native/mr_crc32c.c",
                 "native/mr_sync.c", "native/mr_counter.c", "native/mr_vwshare.c",
                 "native/mr_shm.c", "native/mr_timer.c",
                 "native/mr_module.c"],
        depends=["native/mr_core.h", "native/mr_hmac.h", "native/mr_crc32c.h", "native/mr_shm.h"],
        include_dirs=["native"],
        extra_compile_args=compile_args,
        extra_link_args=link_args,
    )
]

# store.core, store.core.paxos and store.protocol (the messages the core builds and the
# codec every server and client runs), all but their __init__ files (store/core/__init__.py
# chooses the build at import: it must stay source) and txn.py: the ``tx`` API procedures call
# takes whatever a procedure passes and checks it (InvalidRequest), where compiled code
# would refuse a value its annotation does not allow with a TypeError first (the operation
# lists, which it shares its checks with, are in the compiled store/core/oplist.py).
# Beside them the per-request path of servers and clients outside the core: the SDK's
# protocol (not store/client/client.py, whose public methods check what an application
# passes), the replica host, and the RPC core's Python side (the simulator's transport too:
# the simulator runs what production runs).
INTERPRETED = {"__init__.py", "txn.py"}
COMPILED_PACKAGES = ("store/core", "store/protocol")
COMPILED_MODULES = (
    "store/client/protocol.py",
    "store/node/host.py",
    "store/rpc/aio.py",
    "store/rpc/endpoint.py",
    "store/rpc/sim.py",
    "store/rpc/udp.py",
)
# Extensions built here that are not mypyc's.
NOT_MYPYC = {"store.rpc._native"}
manifest = Path("store/core/_compiled.txt")
# Not in a sanitizer build (it is for the RPC extension: tests/rpc/test_rpc_sanitized_suite.py
# builds it from a tree holding only setup.py and native/).
if (
    os.environ.get("MERIDIAN_COMPILE_CORE", "1") != "0"
    and os.environ.get("MERIDIAN_SANITIZE") != "1"
    and Path("store/core").is_dir()
):
    from mypyc.build import mypycify

    sources = [
        path
        for package in COMPILED_PACKAGES
        for path in sorted(Path(package).rglob("*.py")) if path.name not in INTERPRETED
    ] + [Path(module) for module in COMPILED_MODULES]
    core = {".".join(path.with_suffix("").parts): path for path in sources}
    # A module compiled by an earlier build and no longer (or one built before it moved):
    # its extension would be imported instead of its source.
    directories = {*COMPILED_PACKAGES, *(str(Path(module).parent) for module in COMPILED_MODULES)}
    for built in (so for directory in directories for so in Path(directory).rglob("*.so")):
        name = ".".join(built.with_name(built.name.split(".")[0]).parts)
        if name in core or name in NOT_MYPYC or built.name.startswith("_compiled__mypyc"):
            continue
        built.unlink()
    manifest.write_text("".join(
        f"{name} {hashlib.sha256(path.read_bytes()).hexdigest()}\n" for name, path in core.items()
    ))
    extensions += mypycify(
        [str(path) for path in core.values()], opt_level="3", group_name="store.core._compiled"
    )
elif manifest.parent.is_dir():
    manifest.unlink(missing_ok=True)

setup(ext_modules=extensions)
