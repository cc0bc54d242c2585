"""Meridian's wire protocol: every message its servers and its SDK exchange, and their
encoding — everything the SDK needs to talk to a cluster, without the replicas.

* ``messages.py``: the message types (client, certification, gossip, follower snapshot
  reads, configuration manager, state transfer) and the peer request/reply rule;
* ``cluster_map.py``: ``ClusterMap``, the value ``ConfigReply`` carries, and its wire form;
* ``codec.py``: ``encode`` / ``decode`` (msgpack, strictly validated);
* ``wirecheck.py``: the strict decoding helpers the codecs share.

Pure, like ``store.core``: no I/O, clocks or randomness (a test enforces it), and it
imports from ``store.core`` only the small value modules (``vclock``, ``errors``), never a
replica, the configuration manager or Paxos (``tests/client/test_imports.py``). Paxos's own
messages stay with Paxos (``store.core.paxos.messages``): only servers exchange them. Use it
as ``from store.protocol import codec``.

Its modules (all but this file) are compiled with the core (setup.py, docs/performance.md);
``store/__init__.py`` chooses, before any of them loads, whether the compiled build or the
source runs.
"""
