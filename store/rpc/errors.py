"""Typed errors of the RPC layer (DESIGN.md section 6).

Callers act on the class, never on a message string:

    RpcError
    ├── MessageTooLarge        payload above msg_size_max (raised at enqueue, nothing sent)
    ├── BacklogFull            more than backlog_max requests queued on one session
    ├── RequestTimeout         a per-call deadline set by the caller passed (asyncio API)
    ├── RemoteError            the server answered with an error status
    │   ├── HandlerFailed      the handler raised; the message is the server's repr()
    │   └── UnknownRequestType no handler registered for req_type on the server
    └── SessionError           the session can carry no more requests
        ├── SessionClosed      destroyed locally
        ├── SessionRefused     the server is out of credits or sessions (eRPC kRingExhausted)
        │   └── Unauthenticated    the server requires the cluster secret; we lack it
        └── PeerUnavailable    no answer from the peer within session_timeout_ns
            └── PeerRestarted  the peer answered but no longer knows the session

After a SessionError the session is dead: create a new one. A request that failed with a
SessionError may or may not have run at the server (at most once); one that failed with any
other error did not run, except HandlerFailed, where it ran and raised.
"""

from __future__ import annotations


class RpcError(Exception):
    """Base of every error raised by store.rpc."""


class MessageTooLarge(RpcError, ValueError):
    """The payload is larger than the msg_size_max setting."""


class BacklogFull(RpcError):
    """More requests are queued on the session than the backlog_max setting allows."""


class RequestTimeout(RpcError, TimeoutError):
    """The caller's own deadline for one request passed; the session may still be fine."""


class RemoteError(RpcError):
    """The server answered, with an error status instead of a result."""


class HandlerFailed(RemoteError):
    """The server's handler raised an exception."""


class UnknownRequestType(RemoteError):
    """The server has no handler for this request type."""


class SessionError(RpcError):
    """The session failed or was closed; every request on it fails with this error."""


class SessionClosed(SessionError):
    """The session was destroyed by this endpoint."""


class SessionRefused(SessionError):
    """The server refused the session: it has no credits (or session slots) left."""


class Unauthenticated(SessionRefused):
    """The server requires the cluster secret, and this endpoint has none or another one."""


class PeerUnavailable(SessionError):
    """The peer did not answer within session_timeout_ns."""


class PeerRestarted(PeerUnavailable):
    """The peer answers but has forgotten the session: it restarted (or evicted it)."""


# Error codes shared with native/mr_core.h (MR_ERR_*).
ERR_RING_EXHAUSTED = 1
ERR_INVALID_SESSION = 2
ERR_TIMEOUT = 3
ERR_CLOSED = 4
ERR_TOO_LARGE = 5
ERR_BACKLOG_FULL = 6
ERR_NO_SESSION = 7
ERR_STALE = 8
ERR_NO_MEMORY = 9
ERR_BAD_ARGUMENT = 10
ERR_UNAUTHENTICATED = 11

# Response status bytes (carried in the req_type field of response packets).
STATUS_OK = 0
STATUS_HANDLER_FAILED = 1
STATUS_UNKNOWN_REQ_TYPE = 2


def error_for_code(code: int, context: str = "") -> RpcError:
    """The exception for a core error code (positive MR_ERR_* value)."""
    suffix = f": {context}" if context else ""
    if code == ERR_RING_EXHAUSTED:
        return SessionRefused(f"server refused the session (out of credits){suffix}")
    if code == ERR_UNAUTHENTICATED:
        return Unauthenticated(
            f"server refused the session: it requires the cluster secret, and this endpoint "
            f"has none or another one ([security] secret_file){suffix}"
        )
    if code == ERR_INVALID_SESSION:
        return PeerRestarted(f"peer no longer knows the session (restarted?){suffix}")
    if code == ERR_TIMEOUT:
        return PeerUnavailable(f"no answer from peer within the session timeout{suffix}")
    if code == ERR_CLOSED:
        return SessionClosed(f"session closed{suffix}")
    if code == ERR_TOO_LARGE:
        return MessageTooLarge(f"message larger than msg_size_max{suffix}")
    if code == ERR_BACKLOG_FULL:
        return BacklogFull(f"session backlog full{suffix}")
    if code == ERR_NO_SESSION:
        return SessionClosed(f"no such session{suffix}")
    if code == ERR_NO_MEMORY:
        return RpcError(f"out of memory{suffix}")
    return RpcError(f"rpc error code {code}{suffix}")


def error_for_status(status: int, payload: bytes) -> RemoteError:
    """The exception for a non-zero response status."""
    text = payload[:1024].decode("utf-8", "replace")
    if status == STATUS_UNKNOWN_REQ_TYPE:
        return UnknownRequestType(text)
    if status == STATUS_HANDLER_FAILED:
        return HandlerFailed(text)
    return RemoteError(f"status {status}: {text}")
