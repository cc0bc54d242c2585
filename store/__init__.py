"""Meridian, a geo-replicated transactional key-value store (README.md, docs/design.md).

Before any module of the package loads, ``store.corebuild.choose_build`` decides whether the
modules the build compiled with mypyc (the protocol cores, the wire protocol and the
per-request path of servers and clients: setup.py, docs/performance.md) run compiled or
from source; every import of a ``store`` module runs this file first.
"""

from store.corebuild import choose_build

choose_build()
