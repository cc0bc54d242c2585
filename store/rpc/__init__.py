"""Meridian's RPC core: eRPC-style datagram RPC (DESIGN.md section 6, docs/rpc.md).

The protocol runs in C (`store.rpc._native`, built from native/); this package holds the
Python API (Nexus, Rpc, SimRpc, sessions, typed errors) and the transports (UDP, RDMA UD,
simulated). `Rpc` (asyncio) is imported lazily so that simulator code importing
`store.rpc.sim` never pulls in asyncio.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from store.rpc.endpoint import Handler, Nexus, ReqHandle, RpcBase, Session, Transport
from store.rpc.errors import (
    BacklogFull,
    HandlerFailed,
    MessageTooLarge,
    PeerRestarted,
    PeerUnavailable,
    RemoteError,
    RequestTimeout,
    RpcError,
    SessionClosed,
    SessionError,
    SessionRefused,
    Unauthenticated,
    UnknownRequestType,
)
from store.rpc.settings import RpcSettings

if TYPE_CHECKING:
    from store.rpc.aio import Rpc, new_event_loop
    from store.rpc.sim import Pending, SimNetwork, SimRpc
    from store.rpc.udp import UdpTransport

__all__ = [
    "BacklogFull",
    "Handler",
    "HandlerFailed",
    "MessageTooLarge",
    "Nexus",
    "PeerRestarted",
    "PeerUnavailable",
    "Pending",
    "RemoteError",
    "ReqHandle",
    "RequestTimeout",
    "Rpc",
    "RpcBase",
    "RpcError",
    "RpcSettings",
    "Session",
    "SessionClosed",
    "SessionError",
    "SessionRefused",
    "SimNetwork",
    "SimRpc",
    "Transport",
    "UdpTransport",
    "Unauthenticated",
    "UnknownRequestType",
    "new_event_loop",
]

_LAZY = {
    "Rpc": "store.rpc.aio",
    "new_event_loop": "store.rpc.aio",
    "Pending": "store.rpc.sim",
    "SimNetwork": "store.rpc.sim",
    "SimRpc": "store.rpc.sim",
    "UdpTransport": "store.rpc.udp",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'store.rpc' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
