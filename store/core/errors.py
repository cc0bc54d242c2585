"""Typed errors and outcome codes shared by the core, the server and the SDK.

An operating error is something a caller can act on, so each has its own type
(STYLE.md: "invariants are asserted, errors are typed"). The same names are used by the
client SDK, which maps wire outcome codes back to these exceptions.
"""

from __future__ import annotations

import enum
from typing import Final


class MeridianError(Exception):
    """Base of every error Meridian reports to a caller. ``attempts``: how many times the
    SDK ran the transaction (under new ids) before it gave this error."""

    attempts = 1


class InvalidRequest(MeridianError):
    """The request is malformed or breaks a limit; nothing was changed."""


class UnknownProcedure(InvalidRequest):
    """No procedure of that name is registered on the servers."""


class ProcedureFailed(MeridianError):
    """The procedure raised an exception; the transaction was not certified."""


class UserAborted(MeridianError):
    """The procedure chose to abort (``tx.abort(reason)``); nothing was written."""


class Aborted(MeridianError):
    """A conflict aborted the transaction; nothing was written and a retry may succeed."""


class RolledBack(MeridianError):
    """A certified (speculative) transaction was rolled back by failure recovery."""


class Unavailable(MeridianError):
    """The shard that must serve the request cannot be reached; it did not run."""


class OutcomeUnknown(MeridianError):
    """A timeout after the request may have run; retrying with the same id is safe."""


class Status(enum.IntEnum):
    """Outcome codes on the wire (client <-> coordinator)."""

    CERTIFIED = 1  # speculative: visible, may still be rolled back
    COMMITTED = 2  # durable: vc at or below the vector watermark
    ABORTED = 3  # conflict; retryable
    USER_ABORTED = 4  # the procedure aborted itself
    INVALID = 5  # bad request; nothing changed
    PROCEDURE_FAILED = 6  # the procedure raised
    ROLLED_BACK = 7  # recovery rolled it back
    UNAVAILABLE = 8  # the server cannot serve it now (overload, shutting down)
    UNKNOWN_PROCEDURE = 9  # no procedure of that name; nothing changed


FINAL_STATUSES: Final = frozenset(Status) - {Status.CERTIFIED}

ERROR_OF_STATUS: Final[dict[Status, type[MeridianError]]] = {
    Status.ABORTED: Aborted,
    Status.USER_ABORTED: UserAborted,
    Status.INVALID: InvalidRequest,
    Status.PROCEDURE_FAILED: ProcedureFailed,
    Status.ROLLED_BACK: RolledBack,
    Status.UNAVAILABLE: Unavailable,
    Status.UNKNOWN_PROCEDURE: UnknownProcedure,
}
