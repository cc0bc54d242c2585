"""A gRPC bidirectional stream through the proxy: the way replication streams cross regions
(DESIGN.md §4: streams run over gRPC bidirectional streams between regions)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import grpc

from store.wan import Address
from tests.wan.helpers import TARGET_HOST, proxy_to

METHOD = "/meridian.test.Echo/Chat"
MESSAGES = 50
DELAY_MS = 10


def _chat(requests: Iterator[bytes], context: grpc.ServicerContext) -> Iterator[bytes]:
    for request in requests:
        yield b"echo:" + request


def test_bidirectional_stream_through_proxy() -> None:
    grpc_server = grpc.server(ThreadPoolExecutor(max_workers=4))
    handler = grpc.method_handlers_generic_handler(
        "meridian.test.Echo", {"Chat": grpc.stream_stream_rpc_method_handler(_chat)}
    )
    grpc_server.add_generic_rpc_handlers((handler,))
    port = grpc_server.add_insecure_port(f"{TARGET_HOST}:0")
    grpc_server.start()
    try:
        with (
            proxy_to(Address(TARGET_HOST, port), DELAY_MS, jitter_ms=2) as proxy,
            grpc.insecure_channel(str(proxy.address("us-eu"))) as channel,
        ):
            grpc.channel_ready_future(channel).result(timeout=15)
            chat = channel.stream_stream(METHOD)
            started = time.perf_counter()
            replies = list(chat(iter([b"%d" % i for i in range(MESSAGES)]), timeout=15))
            elapsed_s = time.perf_counter() - started
    finally:
        grpc_server.stop(grace=None)
    assert replies == [b"echo:%d" % i for i in range(MESSAGES)]
    # The stream is pipelined: one round trip at least, far fewer than one per message.
    assert elapsed_s >= 2 * (DELAY_MS - 2) / 1000
    assert elapsed_s < MESSAGES * 2 * DELAY_MS / 1000 / 4
