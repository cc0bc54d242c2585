"""The Meridian client SDK (asyncio first, with a blocking wrapper).

    from store.client import Client
    client = await Client.connect("cluster/local.toml")
    await client.put("acct/alice", 100)
    print(await client.run("bank_transfer", 0, 1, 5))

See ``store.client.client`` for the outcome types and errors.
"""

from store.client.client import BlockingClient, Client, TxnBuilder, TxnResult
from store.core.errors import (
    Aborted,
    InvalidRequest,
    MeridianError,
    OutcomeUnknown,
    ProcedureFailed,
    RolledBack,
    Unavailable,
    UnknownProcedure,
    UserAborted,
)

__all__ = [
    "Aborted",
    "BlockingClient",
    "Client",
    "InvalidRequest",
    "MeridianError",
    "OutcomeUnknown",
    "ProcedureFailed",
    "RolledBack",
    "TxnBuilder",
    "TxnResult",
    "Unavailable",
    "UnknownProcedure",
    "UserAborted",
]
