"""Settings of an RPC endpoint. Defaults follow eRPC (src/tweakme.h, src/sm_types.h)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Final

# A UDP endpoint reads at most 16 recvmmsg calls of 64 datagrams per turn of the loop anyway.
RX_DATAGRAMS_PER_POLL_MAX: Final = 16 * 64


def check_rx_datagrams_per_poll(value: int) -> None:
    """ValueError unless ``value`` is a valid ``RpcSettings.rx_datagrams_per_poll``."""
    if not 0 <= value <= RX_DATAGRAMS_PER_POLL_MAX:
        raise ValueError(
            f"rx_datagrams_per_poll must be in [0, {RX_DATAGRAMS_PER_POLL_MAX}], got {value}"
        )


@dataclass(frozen=True)
class RpcSettings:
    """Every limit of the RPC core, checked by the C core when an endpoint is made.

    mtu_bytes: largest datagram, the 16-byte header included (1472: an Ethernet frame's UDP
        payload). Messages are cut into packets of mtu_bytes - 16 bytes of payload.
    session_credits: packets a client may have in flight on one session (eRPC: 32).
    session_req_window: requests outstanding per session; more wait in a backlog (eRPC: 8).
    rto_ns: retransmission timeout (eRPC: 5 ms), and the floor of the adaptive one.
    rto_max_ns: ceiling of the adaptive retransmission timeout. Each client session measures
        the round trips of requests sent once and not said "held" (RFC 6298: srtt + 4
        rttvar, Karn's rule) and uses that, between rto_ns and rto_max_ns: a request that
        waits behind a busy server's other handlers is not taken for a loss. At or below
        rto_ns: a fixed rto_ns.
    rto_held_ns: the retransmission timeout of a request the server has said its handler
        holds (a duplicate of it arrived while the handler ran): only a lost response is left
        to recover, so a long handler (a commit waiting for another region) costs one
        retransmission per rto_held_ns, not one per rto_ns.
    hold_ack_ns: a server says "held" unasked, once, for a request whose handler has run this
        long (at most rto_ns / 2 is used), so a handler that waits behind others on a busy
        server draws no retransmission and ping. Sent when the server next receives a packet
        or ticks; 0: only in answer to a duplicate.
    rx_datagrams_per_poll: datagrams a UDP endpoint reads from its socket each time the
        event loop finds it readable (0, the default: until the socket is empty). At n > 0
        the rest wait for the loop's next turn, so what the first ones made (answers, new
        requests) goes out first, like eRPC's receive batch (kRxBatchSize): processes that
        hand each other requests on the same few cores (a benchmark's client beside its
        shard leaders) work on different parts of the load at once instead of passing all
        of it back and forth in one clump. On 2 cores bench/micro.py ran 4-6% faster at 2
        (8-14% with 128 clients), but geo3 under bench/peers with the machine saturated ran
        2-7% slower waiting for commit (more turns of each busy loop), hence 0 by default
        (docs/rpc.md, "Receive batch"). A receive that leaves datagrams unread judges no
        timeout.
    msg_size_max: largest request or response (default 8 MiB; at most 2**24 - 1).
    sessions_max: session table size of the endpoint, client and server sessions together.
    server_credits_max: credits a server grants over all its sessions; a connect beyond it is
        refused (SessionRefused), as eRPC refuses when its receive ring is exhausted.
    session_timeout_ns: a peer silent this long while requests are outstanding is declared
        unavailable (PeerUnavailable); also the connect timeout.
    backlog_max: requests queued per session beyond the window.
    tx_queue_max: packets queued for sending before further ones are dropped.
    rx_reassembly_bytes_max: bytes a server may hold for multi-packet requests still being
        received; a new request beyond it is dropped (the client retries), so a flood of
        first packets claiming 8 MiB cannot exhaust memory.
    """

    mtu_bytes: int = 1472
    session_credits: int = 32
    session_req_window: int = 8
    rto_ns: int = 5_000_000
    rto_max_ns: int = 20_000_000
    rto_held_ns: int = 50_000_000
    hold_ack_ns: int = 2_500_000
    rx_datagrams_per_poll: int = 0
    msg_size_max: int = 8 << 20
    sessions_max: int = 256
    server_credits_max: int = 256 * 32
    session_timeout_ns: int = 1_000_000_000
    backlog_max: int = 4096
    tx_queue_max: int = 65536
    rx_reassembly_bytes_max: int = 256 << 20

    def __post_init__(self) -> None:
        check_rx_datagrams_per_poll(self.rx_datagrams_per_poll)

    def core_kwargs(self) -> dict[str, Any]:
        """The settings the C core takes (the others are the transport's)."""
        kwargs = dataclasses.asdict(self)
        del kwargs["rx_datagrams_per_poll"]
        return kwargs

    def replace(self, **changes: Any) -> RpcSettings:
        return dataclasses.replace(self, **changes)
