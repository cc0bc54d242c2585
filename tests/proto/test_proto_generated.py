"""The generated code under store/proto/ is exactly what proto/*.proto produces (DESIGN.md §7:
"generated code is checked against them"). Regenerating with the command in the .proto
header and committing the result is the fix when this fails."""

from __future__ import annotations

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


def test_committed_generated_code_matches_the_proto(tmp_path: Path) -> None:
    pytest.importorskip("grpc_tools", reason="grpcio-tools is not installed (pip install .[test])")
    regenerate(tmp_path)
    for name in GENERATED:
        fresh = (tmp_path / "store" / "proto" / name).read_text()
        committed = (REPO / "store" / "proto" / name).read_text()
        assert committed == fresh, f"store/proto/{name} is stale: regenerate (see the .proto)"


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
