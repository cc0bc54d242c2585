"""The generated code under store/proto/ is exactly what proto/*.proto produces (DESIGN.md §7:
"generated code is checked against them"). Regenerating with the command in the .proto
header and committing the result is the fix when this fails."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

GENERATED = ("replication_pb2.py", "replication_pb2.pyi", "replication_pb2_grpc.py")


def regenerate(out: Path) -> None:
    subprocess.run(
        [
            sys.executable, "-m", "grpc_tools.protoc", "-Istore/proto=proto",
            f"--python_out={out}", f"--pyi_out={out}", f"--grpc_python_out={out}",
            "proto/replication.proto",
        ],
        cwd=REPO, check=True, capture_output=True, text=True,
    )


# The versions the generator writes into its output: of grpcio-tools, and of the protoc it
# bundles. A release of either changes them and nothing else; the code is the same.
_VERSION_LINES = (
    (re.compile(r"^GRPC_GENERATED_VERSION = '[^']*'$", re.M), "GRPC_GENERATED_VERSION = <version>"),
    (re.compile(r"^# Protobuf Python Version: \S+$", re.M), "# Protobuf Python Version: <version>"),
    (
        re.compile(r"(ValidateProtobufRuntimeVersion\(\n\s+_runtime_version\.Domain\.PUBLIC,\n)"
                   r"\s+\d+,\n\s+\d+,\n\s+\d+,\n"),
        r"\1    <version>,\n",
    ),
)


def without_versions(text: str) -> str:
    for pattern, replacement in _VERSION_LINES:
        text = pattern.sub(replacement, text)
    return text


def test_committed_generated_code_matches_the_proto(tmp_path: Path) -> None:
    """The same code as a fresh generation, but for the generator's own version numbers
    (a grpcio-tools release on 2026-12-06 changed only GRPC_GENERATED_VERSION, and failed
    CI on a fresh machine)."""
    pytest.importorskip("grpc_tools", reason="grpcio-tools is not installed (pip install .[test])")
    regenerate(tmp_path)
    for name in GENERATED:
        fresh = (tmp_path / "store" / "proto" / name).read_text()
        committed = (REPO / "store" / "proto" / name).read_text()
        assert without_versions(committed) == without_versions(fresh), (
            f"store/proto/{name} is stale: regenerate (see the .proto)"
        )


def test_the_generated_service_accepts_every_grpcio_the_project_allows() -> None:
    """replication_pb2_grpc.py refuses to import under a grpcio older than the one that
    generated it: that one must be the oldest pyproject.toml allows."""
    generated = (REPO / "store" / "proto" / "replication_pb2_grpc.py").read_text()
    found = re.search(r"^GRPC_GENERATED_VERSION = '([^']*)'$", generated, re.M)
    allowed = re.search(r'"grpcio>=([^"]+)"', (REPO / "pyproject.toml").read_text())
    assert found and allowed
    assert found.group(1) == allowed.group(1)


def test_the_header_documents_the_regeneration_command() -> None:
    header = (REPO / "proto" / "replication.proto").read_text()
    assert "python3 -m grpc_tools.protoc -Istore/proto=proto" in header


def test_the_generated_service_imports_and_names_replicate() -> None:
    pytest.importorskip("grpc", reason="grpcio is not installed")
    from store.proto import replication_pb2, replication_pb2_grpc

    assert hasattr(replication_pb2_grpc, "ReplicationStub")
    assert hasattr(replication_pb2_grpc, "add_ReplicationServicer_to_server")
    service = replication_pb2.DESCRIPTOR.services_by_name["Replication"]
    method = service.methods_by_name["Replicate"]
    assert method.client_streaming and method.server_streaming
