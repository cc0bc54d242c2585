"""Request types of Meridian's RPC protocol, shared by servers and the SDK.

Payloads are ``store.protocol.codec`` messages:

* ``SUBMIT``: a client's ``Submit``; the response is an ``Outcome`` — the final one, or
  ``CERTIFIED`` first when the client asked for it (it then submits the same id again,
  without ``want_certified``, to wait for the final outcome).
* ``AWAIT``: a client's ``AwaitOutcomes``, for its transactions answered CERTIFIED; the
  response is an ``Outcomes``, held until at least one of them has its final outcome (a long
  poll: one request for many transactions, where the ``SUBMIT`` of each again would be one
  request per transaction).
* ``PEER``: a message between shard leaders; a request's reply is the RPC response (an empty
  response for one-way messages such as gossip).
* ``SNAPSHOT``: a ``SnapshotRead`` for a follower; the response is a ``SnapshotReply`` at the
  follower's vector watermark (only committed transactions).
* ``STATUS``: an empty request; the response is a msgpack map of the server's health and
  counters.
* ``CONFIG``: a ``GetConfig`` for a configuration manager member; the response is a
  ``ConfigReply`` with the cluster map (docs/recovery.md).
* ``PEER_MANY``: several ``PEER`` payloads from one shard leader to another, everything one
  ``ready()`` sends there, as one msgpack array of the encoded messages
  (``codec.encode_batch``); the response is the array of their replies (empty for one-way
  messages), in the same order.
* ``GENERATE``: a ``store.node.generator.GenerateSpec`` (msgpack map) for a shard leader
  started with ``MERIDIAN_LOAD_GENERATORS=1``: it runs that load itself and, when done,
  answers a msgpack map of counts and latency histograms; otherwise ``{"error": why}``.
"""

SUBMIT = 1
PEER = 2
STATUS = 3
SNAPSHOT = 4
CONFIG = 5
PEER_MANY = 7  # 6 was a batch of submissions, tried and dropped (docs/design.md)
GENERATE = 8
AWAIT = 9
