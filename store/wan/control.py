"""The control endpoint: line-delimited JSON over TCP (``HOST:PORT``) or a Unix socket.

Each request is one JSON object on one line; each reply is one JSON object on one line,
``{"ok": true, ...}`` or ``{"ok": false, "error": "..."}``. A connection may carry any
number of requests. ``send`` is the client a nemesis uses::

    from store.wan import control
    control.send("127.0.0.1:7900", {"op": "partition", "region": "eu", "mode": "drop"})
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
from typing import Any

from store.wan.link import InvalidLink, parse_address
from store.wan.proxy import WanProxy

# A command is a few dozen bytes; a longer line is an error, not a reason to buffer.
LINE_BYTES_MAX = 64 * 1024
SEND_TIMEOUT_S = 5.0


class ControlError(RuntimeError):
    """The proxy answered ``ok: false``; the message is its error."""


def _parse(address: str) -> tuple[str, str | tuple[str, int]]:
    if address.startswith("unix:"):
        return "unix", address.removeprefix("unix:")
    if address.startswith("/"):
        return "unix", address
    try:
        parsed = parse_address(address)
    except InvalidLink as error:
        raise ValueError(f"control address {address!r}: HOST:PORT or unix:PATH") from error
    return "tcp", (parsed.host, parsed.port)


class ControlServer:
    """Serves the control protocol for one ``WanProxy`` on the proxy's loop."""

    def __init__(self, proxy: WanProxy, address: str) -> None:
        self.proxy = proxy
        self.kind, self._where = _parse(address)
        self._server: asyncio.AbstractServer | None = None
        self.address = address

    async def start(self) -> None:
        if self.kind == "unix":
            assert isinstance(self._where, str)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._where)
            self._server = await asyncio.start_unix_server(
                self._serve, self._where, limit=LINE_BYTES_MAX
            )
        else:
            assert isinstance(self._where, tuple)
            host, port = self._where
            self._server = await asyncio.start_server(
                self._serve, host, port, limit=LINE_BYTES_MAX, reuse_address=True
            )
            bound = self._server.sockets[0].getsockname()[1]
            self.address = f"{host}:{bound}"

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                try:
                    line = await reader.readuntil(b"\n")
                except asyncio.IncompleteReadError as error:
                    line = error.partial
                    if not line.strip():
                        return
                except asyncio.LimitOverrunError:
                    writer.write(self._encode({"ok": False, "error": "line too long"}))
                    await writer.drain()
                    return
                writer.write(self._encode(self.handle(line)))
                await writer.drain()
        except (ConnectionError, OSError):
            return
        finally:
            writer.close()

    def handle(self, line: bytes) -> dict[str, Any]:
        try:
            raw = json.loads(line)
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            return {"ok": False, "error": f"not JSON: {error}"}
        except RecursionError:
            return {"ok": False, "error": "not JSON: nested too deeply"}
        return self.proxy.execute(raw)

    @staticmethod
    def _encode(reply: dict[str, Any]) -> bytes:
        return json.dumps(reply, separators=(",", ":")).encode() + b"\n"


def send(
    address: str, command: dict[str, Any], timeout_s: float = SEND_TIMEOUT_S
) -> dict[str, Any]:
    """Send one command and return the reply; ``ControlError`` if the proxy refused it."""
    kind, where = _parse(address)
    family = socket.AF_UNIX if kind == "unix" else socket.AF_INET
    if kind == "tcp" and ":" in where[0]:
        family = socket.AF_INET6
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout_s)
        sock.connect(where)
        sock.sendall(json.dumps(command).encode() + b"\n")
        reply = b""
        while not reply.endswith(b"\n"):
            chunk = sock.recv(65536)
            if not chunk:
                raise ConnectionError(f"control endpoint {address} closed without a reply")
            reply += chunk
            if len(reply) > LINE_BYTES_MAX * 64:
                raise ConnectionError(f"control endpoint {address}: reply too long")
    answer: dict[str, Any] = json.loads(reply)
    if not answer.get("ok"):
        raise ControlError(answer.get("error", "refused"))
    return answer
