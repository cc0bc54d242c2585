"""Server processes: shard-leader workers adapted to the RPC core, gRPC and timers."""
