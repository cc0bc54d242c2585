"""Generated gRPC/protobuf code (from ``proto/``) and its adapters; see replication.proto."""
