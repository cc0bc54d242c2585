"""RDMA unreliable-datagram transport through pyverbs (optional: pip install '.[rdma]').

Written against the documented pyverbs API (rdma-core's Documentation/pyverbs.md and its UD
test resources): a UD queue pair brought to RTS by passing a QPAttr at creation, one
registered buffer for receives (each slot mtu + 40 bytes, since a UD receive starts with the
40-byte GRH) and one for sends, an address handle per peer, one completion queue polled for
both directions.

NOT VERIFIED: the machines this was written on have no RDMA subsystem (get_device_list()
raises PyverbsRDMAError), so this code has never carried a packet. Its tests skip with the
reason. Treat it as a starting point that states the design, not as a tested transport.
The per-packet work here is Python (pyverbs is a Python API); a production RDMA path would
move polling and posting into native/ like the UDP path.

An address is (gid: 16 bytes, qpn, lid); the core sees it as 22 opaque bytes. The sender's
GID is read from bytes 8..24 of the received GRH, which holds on InfiniBand and RoCE with IPv6
GIDs; with RoCE v2 over IPv4 the 40-byte area holds an IPv4 header in its last 20 bytes
instead, which this code does not decode yet (a known gap).
"""

from __future__ import annotations

import struct
from typing import Any, NamedTuple

from store.rpc import _native
from store.rpc.endpoint import Transport

GRH_BYTES = 40
UD_QKEY = 0x11111111
RECV_DEPTH = 512
SEND_DEPTH = 512
ADDRESS_FORMAT = "<16sIH"  # gid, qpn, lid: 22 bytes


class RdmaAddress(NamedTuple):
    gid: bytes
    qpn: int
    lid: int


def encode_address(address: RdmaAddress | tuple[bytes, int, int]) -> bytes:
    gid, qpn, lid = address
    if len(gid) != 16:
        raise ValueError("gid must be 16 bytes")
    return struct.pack(ADDRESS_FORMAT, gid, qpn, lid)


def decode_address(raw: bytes) -> RdmaAddress:
    gid, qpn, lid = struct.unpack(ADDRESS_FORMAT, raw)
    return RdmaAddress(gid, qpn, lid)


def gid_text(gid: bytes) -> str:
    """16 bytes to pyverbs' 'xxxx:xxxx:...' form."""
    return ":".join(gid[i : i + 2].hex() for i in range(0, 16, 2))


def gid_bytes(text: str) -> bytes:
    return bytes.fromhex(text.replace(":", ""))


def rdma_unavailable_reason() -> str | None:
    """None if pyverbs imports and lists at least one device, else why not (for skips)."""
    try:
        from pyverbs import device
    except ImportError as exc:
        return f"pyverbs is not installed (optional extra 'rdma'): {exc}"
    try:
        devices = device.get_device_list()
    except Exception as exc:  # PyverbsRDMAError when the kernel has no RDMA subsystem
        return f"pyverbs.device.get_device_list() failed: {exc!r}"
    if not devices:
        return "no RDMA device present"
    return None


class RdmaUnavailable(RuntimeError):
    """A cluster file asks for ``transport = "rdma"`` where it cannot be used."""


def require_rdma() -> None:
    """Raises ``RdmaUnavailable`` saying why a process cannot run on RDMA here.

    Two reasons: no usable device (pyverbs missing, no RDMA subsystem, no device), or, where
    there is one, that processes cannot find each other yet: an RDMA UD endpoint is a
    (GID, QP number, LID), not the cluster file's host:port, and the exchange of those
    addresses is not built (the transport itself has never carried a packet: see above)."""
    reason = rdma_unavailable_reason()
    if reason is not None:
        raise RdmaUnavailable(f'transport = "rdma" needs an RDMA device on this machine: {reason}')
    raise RdmaUnavailable(
        'transport = "rdma": an RDMA device is present, but Meridian cannot yet resolve the '
        "cluster file's host:port addresses to RDMA endpoints (GID, QP number); use "
        'transport = "udp"'
    )


def _enums() -> Any:
    try:
        from pyverbs import enums
    except ImportError:  # older layouts
        import pyverbs.libibverbs_enums as enums
    return enums


class RdmaUdTransport(Transport):
    """A UD queue pair on one RDMA port. Polled: fileno() is None, the endpoint polls."""

    def __init__(
        self,
        device_name: str | None = None,
        *,
        port_num: int = 1,
        gid_index: int = 0,
        recv_depth: int = RECV_DEPTH,
        send_depth: int = SEND_DEPTH,
    ) -> None:
        from pyverbs import device
        from pyverbs.cq import CQ
        from pyverbs.mr import MR
        from pyverbs.pd import PD
        from pyverbs.qp import QP, QPAttr, QPCap, QPInitAttr

        e = _enums()
        self._e = e
        if device_name is None:
            devices = device.get_device_list()
            if not devices:
                raise RuntimeError("no RDMA device present")
            name = devices[0].name
            device_name = name.decode() if isinstance(name, bytes) else str(name)
        self.ctx = device.Context(name=device_name)
        self.port_num = port_num
        self.gid_index = gid_index
        port = self.ctx.query_port(port_num)
        # ibv_mtu enum: 1 -> 256 bytes ... 5 -> 4096 bytes. A UD message fits one path MTU.
        self.mtu_bytes = 128 << int(port.active_mtu)
        self.pd = PD(self.ctx)
        self.cq = CQ(self.ctx, recv_depth + send_depth, None, None, 0)
        self._recv_stride = self.mtu_bytes + GRH_BYTES
        self.recv_mr = MR(self.pd, self._recv_stride * recv_depth, e.IBV_ACCESS_LOCAL_WRITE)
        self.send_mr = MR(self.pd, self.mtu_bytes * send_depth, e.IBV_ACCESS_LOCAL_WRITE)
        cap = QPCap(max_send_wr=send_depth, max_recv_wr=recv_depth, max_send_sge=1,
                    max_recv_sge=1)
        init = QPInitAttr(qp_type=e.IBV_QPT_UD, scq=self.cq, rcq=self.cq, cap=cap)
        attr = QPAttr(port_num=port_num)
        attr.qkey = UD_QKEY
        attr.pkey_index = 0
        self.qp = QP(self.pd, init, attr)  # a UD QP given a QPAttr is brought to RTS
        gid = gid_bytes(str(self.ctx.query_gid(port_num, gid_index).gid))
        self.address = RdmaAddress(gid, int(self.qp.qp_num), int(port.lid))
        self._recv_depth = recv_depth
        self._send_depth = send_depth
        self._send_free = list(range(send_depth))
        self._ah_cache: dict[bytes, Any] = {}
        for slot in range(recv_depth):
            self._post_recv(slot)

    # --- Transport -------------------------------------------------------------------------

    def encode_address(self, address: Any) -> bytes:
        return encode_address(address)

    def decode_address(self, raw: bytes) -> RdmaAddress:
        return decode_address(raw)

    def receive(self, core: _native.Core, now_ns: int) -> list[tuple[Any, ...]]:
        e = self._e
        while True:
            polled, wcs = self.cq.poll(64)
            if polled <= 0:
                break
            for wc in wcs:
                if wc.wr_id >= self._recv_depth:  # a send completion: recycle its slot
                    self._send_free.append(wc.wr_id - self._recv_depth)
                    continue
                slot = wc.wr_id
                if wc.status == e.IBV_WC_SUCCESS and wc.byte_len >= GRH_BYTES:
                    offset = slot * self._recv_stride
                    grh = self.recv_mr.read(GRH_BYTES, offset)
                    payload = self.recv_mr.read(wc.byte_len - GRH_BYTES, offset + GRH_BYTES)
                    # GRH bytes 8..24 hold the source GID.
                    src = struct.pack(ADDRESS_FORMAT, bytes(grh[8:24]), wc.src_qp, wc.slid)
                    core.feed(src, payload, now_ns)
                self._post_recv(slot)
        events: list[tuple[Any, ...]] = core.take_events()
        return events

    def flush(self, core: _native.Core) -> None:
        if not core.pending_packets():
            return
        from pyverbs.wr import SGE, SendWR

        e = self._e
        for raw, datagram in core.take_packets():
            if not self._send_free:
                self.receive_send_completions()
            if not self._send_free:
                continue  # send queue full: a loss, which retransmission recovers
            slot = self._send_free.pop()
            offset = slot * self.mtu_bytes
            self.send_mr.write(datagram, len(datagram), offset)
            sge = SGE(self.send_mr.buf + offset, len(datagram), self.send_mr.lkey)
            wr = SendWR(wr_id=self._recv_depth + slot, opcode=e.IBV_WR_SEND, num_sge=1,
                        sg=[sge], send_flags=e.IBV_SEND_SIGNALED)
            address = decode_address(raw)
            wr.set_wr_ud(self._ah(raw, address), address.qpn, UD_QKEY)
            self.qp.post_send(wr)

    def close(self) -> None:
        for obj in (self.qp, self.send_mr, self.recv_mr, self.cq, self.pd, self.ctx):
            obj.close()

    # --- internals -------------------------------------------------------------------------

    def receive_send_completions(self) -> None:
        """Reap completions without a core (when the send queue is full). Receive completions
        seen here are re-posted unread: a loss, which the protocol tolerates."""
        polled, wcs = self.cq.poll(64)
        for wc in wcs[: max(polled, 0)]:
            if wc.wr_id >= self._recv_depth:
                self._send_free.append(wc.wr_id - self._recv_depth)
            else:
                self._post_recv(wc.wr_id)

    def _post_recv(self, slot: int) -> None:
        from pyverbs.wr import SGE, RecvWR

        sge = SGE(self.recv_mr.buf + slot * self._recv_stride, self._recv_stride,
                  self.recv_mr.lkey)
        self.qp.post_recv(RecvWR(wr_id=slot, num_sge=1, sg=[sge]))

    def _ah(self, raw: bytes, address: RdmaAddress) -> Any:
        ah = self._ah_cache.get(raw)
        if ah is None:
            from pyverbs.addr import AH, GID, AHAttr, GlobalRoute

            gid = GID()
            gid.gid = gid_text(address.gid)
            route = GlobalRoute(dgid=gid, sgid_index=self.gid_index)
            attr = AHAttr(gr=route, is_global=1, port_num=self.port_num, dlid=address.lid)
            ah = AH(self.pd, attr=attr)
            self._ah_cache[raw] = ah
        return ah
