"""Link options and the control endpoint on a Unix socket, in one process."""

from __future__ import annotations

import json
import socket
import threading
from pathlib import Path

import pytest

from store.wan import Address, ControlError, LinkSpec, ProxyThread, parse_link, send
from store.wan.control import LINE_BYTES_MAX
from tests.wan.helpers import TARGET_HOST, connect, recv_exactly


def test_source_address_is_what_the_target_sees() -> None:
    listener = socket.create_server((TARGET_HOST, 0))
    seen: list[str] = []

    def accept() -> None:
        conn, peer = listener.accept()
        seen.append(peer[0])
        conn.sendall(b"k")
        conn.close()

    thread = threading.Thread(target=accept)
    thread.start()
    spec = parse_link(f"eu-us=127.0.0.1:0>{TARGET_HOST}:{listener.getsockname()[1]}@127.0.0.3")
    try:
        with ProxyThread([spec]) as proxy, connect(proxy.address("eu-us")) as sock:
            assert recv_exactly(sock, 1) == b"k"
    finally:
        thread.join(timeout=10)
        listener.close()
    assert seen == ["127.0.0.3"]


def test_control_on_a_unix_socket(tmp_path: Path) -> None:
    path = tmp_path / "wan.sock"
    spec = LinkSpec("us-eu", Address("127.0.0.1", 0), Address(TARGET_HOST, 9), 5.0)
    with ProxyThread([spec], control=f"unix:{path}") as proxy:
        address = f"unix:{path}"
        assert send(address, {"op": "partition", "between": ["eu", "us"], "mode": "hold"})[
            "links"
        ] == ["us-eu"]
        assert proxy.status()[0]["partition"] == "hold"
        send(address, {"op": "heal", "region": "us"})
        with pytest.raises(ControlError, match="unknown op"):
            send(address, {"op": "reboot"})
        with socket.socket(socket.AF_UNIX) as sock:
            sock.settimeout(10)
            sock.connect(str(path))
            reader = sock.makefile("rb")
            sock.sendall(b"[" * 50_000 + b"\n")
            assert "nested" in json.loads(reader.readline())["error"]
            sock.sendall(b"x" * (LINE_BYTES_MAX + 10) + b"\n")
            assert "too long" in json.loads(reader.readline())["error"]
        assert proxy.status()[0]["partition"] is None
        assert send(address, {"op": "ping"}) == {"ok": True}
