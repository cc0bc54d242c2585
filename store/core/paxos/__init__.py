"""Multi-Paxos replication streams (DESIGN.md §4, §5); see docs/replication.md.

One stream per shard-leader worker. Its ``StreamLeader`` batches certified transaction
records into entries and gets each slot accepted by a majority of regions (its own region
counts as one acceptor); ``Acceptor`` and ``Learner`` run in the other regions
(``StreamFollower`` pairs them). All three are pure: fed ``handle(now_ns, src, message)``
and ``tick(now_ns)``, they hand back a ``StreamReady`` of messages to send, chosen entries
in slot order, and the next wake-up time.
"""

from store.core.paxos.acceptor import Acceptor
from store.core.paxos.leader import Phase, StreamLeader
from store.core.paxos.learner import Learner, StreamFollower
from store.core.paxos.messages import (
    Accept,
    Accepted,
    Chosen,
    Commit,
    Fetch,
    PaxosMessage,
    Prepare,
    Promise,
    Reject,
    decode,
    encode,
)
from store.core.paxos.types import (
    DEFAULT_STREAM_SETTINGS,
    INF,
    NOOP,
    ZERO_BALLOT,
    Ballot,
    Entry,
    EntryKind,
    Finalized,
    StreamReady,
    StreamSettings,
    finalized_watermark,
)

__all__ = [
    "DEFAULT_STREAM_SETTINGS",
    "INF",
    "NOOP",
    "ZERO_BALLOT",
    "Accept",
    "Accepted",
    "Acceptor",
    "Ballot",
    "Chosen",
    "Commit",
    "Entry",
    "EntryKind",
    "Fetch",
    "Finalized",
    "Learner",
    "PaxosMessage",
    "Phase",
    "Prepare",
    "Promise",
    "Reject",
    "StreamFollower",
    "StreamLeader",
    "StreamReady",
    "StreamSettings",
    "decode",
    "encode",
    "finalized_watermark",
]
