"""Build of Meridian's C extension (the RPC protocol core, docs/rpc.md).

Everything else about the package lives in pyproject.toml. Set MERIDIAN_SANITIZE=1 to build
the extension with AddressSanitizer and UndefinedBehaviorSanitizer (see docs/rpc.md for how to
load it into Python).
"""

import os

from setuptools import Extension, setup

compile_args = ["-O2", "-std=c11", "-Wall", "-Wextra", "-Wno-missing-field-initializers"]
link_args: list[str] = []
if os.environ.get("MERIDIAN_SANITIZE") == "1":
    sanitize = ["-fsanitize=address,undefined", "-fno-sanitize-recover=undefined",
                "-fno-omit-frame-pointer", "-g"]
    compile_args = [*compile_args, *sanitize]
    link_args = [*link_args, *sanitize]

setup(
    ext_modules=[
        Extension(
            "store.rpc._native",
            sources=["native/mr_core.c", "native/mr_hmac.c", "native/mr_crc32c.c",
                     "native/mr_sync.c", "native/mr_counter.c", "native/mr_vwshare.c",
                     "native/mr_shm.c",
                     "native/mr_module.c"],
            depends=["native/mr_core.h", "native/mr_hmac.h", "native/mr_crc32c.h", "native/mr_shm.h"],
            include_dirs=["native"],
            extra_compile_args=compile_args,
            extra_link_args=link_args,
        )
    ]
)
