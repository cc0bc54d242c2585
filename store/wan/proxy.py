"""The proxy: asyncio adapter that moves bytes between sockets through delay lines.

Theory of operation. Each link listens on one address. An accepted connection (the
*client* side) gets an outgoing connection to the link's target (the *upstream* side)
and two pipes, one per direction; a pipe is a ``DelayLine`` plus one loop timer for its
head, so a connection costs two timers however many chunks are in flight.

Flow control is by buffer, never by rate: a pipe stops reading its source when it holds
``buffer_bytes_max`` bytes and resumes at half that, and stops writing while the
destination transport reports its write buffer full. Everything else goes as fast as
the loop can move it.

Partitions act on every connection of a link, current and future:

- ``drop``: queued data is discarded and both sides are reset (RST); connections accepted
  while the link is dropped are reset at once. TCP on a cut cable would time out rather
  than see a reset, but a reset is what it eventually amounts to, and it is immediate.
- ``hold``: nothing crosses the link; new connections are accepted but do not reach the
  target. On heal everything held is delivered in order, one delay after the heal.

Half-close travels in order: a FIN is queued behind the data sent before it. A reset
seen on one side resets the other at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
import struct
import time
from typing import Any

from store.rpc.timers import PreciseTimer, PreciseTimers
from store.wan.commands import Command, InvalidCommand, Selector, parse_command
from store.wan.delay import EOF, DelayLine
from store.wan.link import Address, LinkSpec

# Per connection and direction. It must exceed the bandwidth-delay product the emulation is
# asked to carry (64 MiB at 50 ms one way is 1.3 GB/s), or the buffer, not the delay, sets
# the throughput.
BUFFER_BYTES_MAX = 64 * 1024 * 1024
# Write buffer at which a transport asks us to stop writing: large, because the delay line
# already bounds what we buffer and small limits cost a pause/resume per few chunks.
WRITE_BUFFER_HIGH_BYTES = 4 * 1024 * 1024
LISTEN_BACKLOG = 1024

CLIENT = 0
UPSTREAM = 1
_LINGER_RESET = struct.pack("ii", 1, 0)


def _reset(transport: asyncio.BaseTransport | None) -> None:
    """Close with RST, as a peer whose path vanished would eventually see."""
    if transport is None or transport.is_closing():
        return
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RESET)
    transport.abort()  # type: ignore[attr-defined]


class _Link:
    """Run-time state of one link."""

    def __init__(self, spec: LinkSpec) -> None:
        self.spec = spec
        self.delay_ms = spec.delay_ms
        self.jitter_ms = spec.jitter_ms
        self.partition: str | None = None
        self.connections: set[_Connection] = set()
        self.server: asyncio.AbstractServer | None = None
        self.bound: Address = spec.listen
        self.accepted = 0
        self.resets = 0
        self.bytes_forwarded = 0

    @property
    def delay_ns(self) -> int:
        return round(self.delay_ms * 1_000_000)

    @property
    def jitter_ns(self) -> int:
        return round(self.jitter_ms * 1_000_000)

    def status(self) -> dict[str, Any]:
        return {
            "name": self.spec.name,
            "listen": str(self.bound),
            "target": str(self.spec.target),
            "source": self.spec.source,
            "regions": sorted(self.spec.regions),
            "delay_ms": self.delay_ms,
            "jitter_ms": self.jitter_ms,
            "partition": self.partition,
            "connections": len(self.connections),
            "queued_bytes": sum(
                pipe.line.queued_bytes for c in self.connections for pipe in c.pipes
            ),
            "accepted": self.accepted,
            "resets": self.resets,
            "bytes_forwarded": self.bytes_forwarded,
        }


class _Pipe:
    """One direction of one connection: a delay line between two transports."""

    def __init__(self, connection: _Connection, rng: random.Random) -> None:
        self.connection = connection
        self.line = DelayLine(rng)
        self.source: asyncio.Transport | None = None
        self.dest: asyncio.Transport | None = None
        self.dest_paused = False
        self.source_paused = False
        self.eof_delivered = False
        self._timer: PreciseTimer | None = None

    def push(self, data: bytes | None) -> None:
        link = self.connection.link
        now_ns = time.monotonic_ns()
        self.line.push(data, now_ns, link.delay_ns, link.jitter_ns)
        if self.line.is_due(now_ns) and self.dest is not None and not self.dest_paused:
            # Due on arrival (0 ms link): write now, not after a trip through the timer queue.
            self.cancel()
            self._fire()
            return
        if (
            self.line.queued_bytes >= self.connection.proxy.buffer_bytes_max
            and not self.source_paused
            and self.source is not None
            and not self.source.is_closing()
        ):
            self.source_paused = True
            self.source.pause_reading()
        self.schedule()

    def schedule(self) -> None:
        """Arm the head's timer if there is a head and somewhere to deliver it."""
        if self._timer is not None or self.dest is None or self.dest_paused:
            return
        release_at_ns = self.line.next_release_at_ns()
        if release_at_ns is None:
            return
        self._timer = self.connection.proxy.timers.call_at(release_at_ns, self._fire)

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _fire(self) -> None:
        # The timers never fire early (store.rpc.timers); ``is_due`` reads the clock anyway,
        # so a chunk is never released before its time whatever woke this.
        self._timer = None
        dest = self.dest
        if dest is None or self.dest_paused or self.connection.closed:
            return  # resume_writing (or the upstream connecting) schedules again
        now_ns = time.monotonic_ns()
        batch: list[bytes] = []
        eof = False
        while self.line.is_due(now_ns):
            data = self.line.pop()
            if data is EOF:
                eof = True
                break
            batch.append(data)
        if batch:
            self.connection.link.bytes_forwarded += sum(map(len, batch))
            dest.writelines(batch)
        if eof:
            self.eof_delivered = True
            if dest.can_write_eof():
                dest.write_eof()
            self.connection.eof_delivered()
            return
        if (
            self.source_paused
            and self.line.queued_bytes <= self.connection.proxy.buffer_bytes_max // 2
            and self.source is not None
            and not self.source.is_closing()
        ):
            self.source_paused = False
            self.source.resume_reading()
        self.schedule()


class _Side(asyncio.Protocol):
    """Protocol for one socket of a proxied connection."""

    def __init__(self, connection: _Connection, side: int) -> None:
        self.connection = connection
        self.side = side

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self.connection.side_made(self.side, transport)  # type: ignore[arg-type]

    def data_received(self, data: bytes) -> None:
        self.connection.pipes[self.side].push(data)

    def eof_received(self) -> bool:
        self.connection.pipes[self.side].push(EOF)
        return True  # keep the other direction open (half-close)

    def connection_lost(self, exc: Exception | None) -> None:
        self.connection.side_lost(self.side)

    def pause_writing(self) -> None:
        self.connection.pipes[1 - self.side].dest_paused = True

    def resume_writing(self) -> None:
        pipe = self.connection.pipes[1 - self.side]
        pipe.dest_paused = False
        pipe.schedule()


class _Connection:
    """A client connection, its upstream connection and the two pipes between them."""

    def __init__(self, proxy: WanProxy, link: _Link, number: int) -> None:
        self.proxy = proxy
        self.link = link
        self.number = number
        self.transports: list[asyncio.Transport | None] = [None, None]
        self.pipes = [
            _Pipe(self, random.Random(f"{proxy.seed}/{link.spec.name}/{number}/{side}"))
            for side in (CLIENT, UPSTREAM)
        ]
        self.connecting = False
        self.closed = False

    def side_made(self, side: int, transport: asyncio.Transport) -> None:
        if self.closed:
            _reset(transport)
            return
        self.transports[side] = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        transport.set_write_buffer_limits(high=WRITE_BUFFER_HIGH_BYTES)
        self.pipes[side].source = transport
        self.pipes[1 - side].dest = transport
        if side == CLIENT:
            self.link.accepted += 1
            self.link.connections.add(self)
            if self.link.partition == "drop":
                self.reset()
                return
            if self.link.partition == "hold":
                for pipe in self.pipes:
                    pipe.line.hold()
                return  # the SYN is held too: connect on heal
            self.connect()
        else:
            self.pipes[CLIENT].schedule()

    def connect(self) -> None:
        if self.connecting or self.closed:
            return
        self.connecting = True
        self.proxy.spawn(self._connect())

    async def _connect(self) -> None:
        target = self.link.spec.target
        source = self.link.spec.source
        try:
            await self.proxy.loop.create_connection(
                lambda: _Side(self, UPSTREAM),
                target.host,
                target.port,
                local_addr=(source, 0) if source is not None else None,
            )
        except OSError:
            self.reset()  # the target refused or is unreachable: the client sees a reset

    def eof_delivered(self) -> None:
        if all(pipe.eof_delivered for pipe in self.pipes):
            self._forget()
            for transport in self.transports:
                if transport is not None:
                    transport.close()

    def side_lost(self, side: int) -> None:
        if not self.closed and not all(pipe.eof_delivered for pipe in self.pipes):
            self.reset()

    def hold(self) -> None:
        for pipe in self.pipes:
            pipe.cancel()
            pipe.line.hold()

    def heal(self) -> None:
        now_ns = time.monotonic_ns()
        for pipe in self.pipes:
            pipe.line.release(now_ns, self.link.delay_ns, self.link.jitter_ns)
            pipe.schedule()
        if self.transports[UPSTREAM] is None:
            self.connect()

    def reset(self) -> None:
        if self.closed:
            return
        self.link.resets += 1
        self._forget()
        for pipe in self.pipes:
            pipe.line.clear()
        for transport in self.transports:
            _reset(transport)

    def _forget(self) -> None:
        self.closed = True
        for pipe in self.pipes:
            pipe.cancel()
        self.link.connections.discard(self)


class WanProxy:
    """Many links in one event loop, with run-time partitions and delays.

    Call every method on the loop's thread (``ProxyThread`` wraps one for other threads).
    """

    def __init__(
        self,
        links: list[LinkSpec],
        seed: int = 0,
        buffer_bytes_max: int = BUFFER_BYTES_MAX,
    ) -> None:
        names = [spec.name for spec in links]
        if len(set(names)) != len(names):
            raise ValueError(f"link names must be unique: {names}")
        assert buffer_bytes_max > 0
        self.links = {spec.name: _Link(spec) for spec in links}
        self.seed = seed
        self.buffer_bytes_max = buffer_bytes_max
        self._tasks: set[asyncio.Task[None]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timers: PreciseTimers | None = None

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        assert self._loop is not None, "start() the proxy first"
        return self._loop

    @property
    def timers(self) -> PreciseTimers:
        """The delay lines' timers: to the microsecond (uvloop's round to the millisecond)."""
        assert self._timers is not None, "start() the proxy first"
        return self._timers

    def spawn(self, coroutine: Any) -> None:
        task = self.loop.create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def start(self) -> None:
        """Listen on every link's address."""
        self._loop = asyncio.get_running_loop()
        self._timers = PreciseTimers(self._loop)
        for link in self.links.values():
            counter = iter(range(1 << 62))

            def accept(link: _Link = link, counter: Any = counter) -> _Side:
                return _Side(_Connection(self, link, next(counter)), CLIENT)

            listen = link.spec.listen
            link.server = await self.loop.create_server(
                accept, listen.host, listen.port, reuse_address=True, backlog=LISTEN_BACKLOG
            )
            port = link.server.sockets[0].getsockname()[1]
            link.bound = Address(listen.host, port)

    async def close(self) -> None:
        """Stop listening and reset every connection."""
        for link in self.links.values():
            if link.server is not None:
                link.server.close()
            for connection in list(link.connections):
                connection.reset()
        for link in self.links.values():
            if link.server is not None:
                await link.server.wait_closed()
        for task in list(self._tasks):
            task.cancel()
        if self._timers is not None:
            self._timers.close()  # a chunk scheduled after this is never released

    def address(self, name: str) -> Address:
        """Where link ``name`` listens (with the real port if it was configured as 0)."""
        return self.links[name].bound

    # Run-time control. ``execute`` is the whole control protocol; the methods below build
    # the same commands so that tests and the control endpoint take one path.

    def execute(self, raw: object) -> dict[str, Any]:
        """Apply a decoded JSON command; the reply says ``ok`` or gives the ``error``."""
        try:
            command = parse_command(raw)
            return {"ok": True, **self.apply(command)}
        except InvalidCommand as error:
            return {"ok": False, "error": str(error)}

    def apply(self, command: Command) -> dict[str, Any]:
        if command.op == "ping":
            return {}
        names = command.select((n, link.spec.regions) for n, link in self.links.items())
        chosen = [self.links[name] for name in names]
        if command.op == "status":
            return {"links": [link.status() for link in chosen]}
        for link in chosen:
            if command.op == "partition":
                self._partition(link, command.mode or "drop")
            elif command.op == "heal":
                self._heal(link)
            elif command.op == "set_delay":
                assert command.delay_ms is not None
                link.delay_ms = command.delay_ms
                if command.jitter_ms is not None:
                    link.jitter_ms = command.jitter_ms
        return {"links": names}

    def _partition(self, link: _Link, mode: str) -> None:
        link.partition = mode
        for connection in list(link.connections):
            if mode == "drop":
                connection.reset()
            else:
                connection.hold()

    def _heal(self, link: _Link) -> None:
        link.partition = None
        for connection in list(link.connections):
            connection.heal()

    def partition(
        self,
        link: str | None = None,
        *,
        region: str | None = None,
        between: tuple[str, str] | None = None,
        mode: str = "drop",
    ) -> list[str]:
        return self._call("partition", link, region, between, mode=mode)

    def heal(
        self,
        link: str | None = None,
        *,
        region: str | None = None,
        between: tuple[str, str] | None = None,
    ) -> list[str]:
        return self._call("heal", link, region, between)

    def set_delay(
        self,
        link: str | None = None,
        *,
        region: str | None = None,
        between: tuple[str, str] | None = None,
        delay_ms: float,
        jitter_ms: float | None = None,
    ) -> list[str]:
        fields: dict[str, Any] = {"delay_ms": delay_ms}
        if jitter_ms is not None:
            fields["jitter_ms"] = jitter_ms
        return self._call("set_delay", link, region, between, **fields)

    def status(self) -> list[dict[str, Any]]:
        return self.apply(parse_command({"op": "status"}))["links"]  # type: ignore[no-any-return]

    def _call(
        self,
        op: str,
        link: str | None,
        region: str | None,
        between: tuple[str, str] | None,
        **fields: Any,
    ) -> list[str]:
        raw: dict[str, Any] = {"op": op, **fields}
        if link is not None:
            raw["link"] = link
        if region is not None:
            raw["region"] = region
        if between is not None:
            raw["between"] = list(between)
        names: list[str] = self.apply(parse_command(raw))["links"]
        return names


__all__ = ["BUFFER_BYTES_MAX", "Selector", "WanProxy"]
