"""Meridian's pure protocol cores: no I/O, no clocks, no randomness (DESIGN.md §7).

The modules of this package (and of ``store.core.paxos`` and ``store.protocol``), all but
the ``__init__`` files and ``txn.py`` (the ``tx`` API procedures call, see
``store.core.oplist``), are compiled to C by mypyc when the package is built (setup.py;
docs/performance.md): the same source, run about 2.5 to 4 times faster; the per-request path
around them (the SDK's protocol, the replica host, the RPC core's Python side) with them.
``store/__init__.py`` decides, before any of them is imported, which build runs:

* the compiled one, when its extension modules are there and every source file is the one
  they were compiled from (``_compiled.txt``, written by the build, holds each file's
  SHA-256);
* the source, when ``MERIDIAN_PURE_PYTHON=1`` (profiling by function, tests that patch a
  core class: a compiled class cannot be patched), or when a source file changed since the
  build: running code that is not the source would be worse than running slower, so the
  whole package runs from source then (its compiled modules call one another directly, so
  it is all or nothing) and a warning says to rebuild (``pip install -e .``).

``compiled()`` says which one this process runs.
"""

from store.corebuild import compiled

__all__ = ["compiled"]
