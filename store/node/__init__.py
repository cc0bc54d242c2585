"""Server processes: shard-leader workers adapted to the RPC core, gRPC and timers."""

import os

# grpc's EventEngine listener reads an accepted connection on its own threads and hands each
# message to grpc.aio's poller thread and then to the event loop: four thread wakeups a
# message. Without it (grpc's older listener) the poller thread reads the socket itself. On
# this project's 2-core test machine a message received costs ~75 us of CPU instead of
# ~140, and a geo3 cluster waiting for commit wakes 9,600 times a second instead of 15,700
# (docs/replication.md, "gRPC transport"). grpc reads the variable once, when it is first
# imported, so it is set here, before any module of this package imports grpc
# (store.node.replication); an operator's own GRPC_EXPERIMENTS is kept.
GRPC_EXPERIMENTS = "-event_engine_listener"
os.environ.setdefault("GRPC_EXPERIMENTS", GRPC_EXPERIMENTS)
