"""A ``WanProxy`` on its own thread and loop, for tests that drive it from Python."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from store.wan.control import ControlServer
from store.wan.link import Address, LinkSpec
from store.wan.proxy import BUFFER_BYTES_MAX, WanProxy

T = TypeVar("T")
START_TIMEOUT_S = 10.0
CALL_TIMEOUT_S = 10.0


def new_event_loop() -> asyncio.AbstractEventLoop:
    """A uvloop loop, as ``store.rpc.aio.new_event_loop`` makes.

    Not imported from there: ``store.rpc`` loads the C extension, and the proxy must run
    (and its tests pass) whatever state that build is in, e.g. while a sanitizer build of
    it is in place, which aborts any process that loads it without the ASan runtime.
    """
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency
        return asyncio.new_event_loop()
    loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    return loop


class ProxyThread:
    """Runs a proxy (and optionally its control endpoint) until ``stop``.

    Every method may be called from any thread; each runs on the proxy's loop and waits.
    Use as a context manager.
    """

    def __init__(
        self,
        links: list[LinkSpec],
        seed: int = 0,
        control: str | None = None,
        buffer_bytes_max: int = BUFFER_BYTES_MAX,
    ) -> None:
        self.proxy = WanProxy(links, seed=seed, buffer_bytes_max=buffer_bytes_max)
        self.control: ControlServer | None = (
            ControlServer(self.proxy, control) if control is not None else None
        )
        self.loop = new_event_loop()
        self._thread = threading.Thread(target=self._run, name="wan-proxy", daemon=True)
        self._started: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._stopping: asyncio.Event | None = None

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_until_complete(self._main())
        finally:
            self.loop.close()

    async def _main(self) -> None:
        self._stopping = asyncio.Event()
        try:
            await self.proxy.start()
            if self.control is not None:
                await self.control.start()
        except BaseException as error:
            self._started.set_exception(error)
            await self.proxy.close()
            return
        self._started.set_result(None)
        await self._stopping.wait()
        if self.control is not None:
            await self.control.close()
        await self.proxy.close()

    def start(self) -> ProxyThread:
        self._thread.start()
        self._started.result(timeout=START_TIMEOUT_S)
        return self

    def stop(self) -> None:
        if self._thread.is_alive():
            assert self._stopping is not None
            self.loop.call_soon_threadsafe(self._stopping.set)
            self._thread.join(timeout=START_TIMEOUT_S)

    def __enter__(self) -> ProxyThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def call(self, function: Callable[[WanProxy], T]) -> T:
        """Run ``function(proxy)`` on the proxy's loop and return its result."""
        future: concurrent.futures.Future[T] = concurrent.futures.Future()

        def run() -> None:
            try:
                future.set_result(function(self.proxy))
            except BaseException as error:
                future.set_exception(error)

        self.loop.call_soon_threadsafe(run)
        return future.result(timeout=CALL_TIMEOUT_S)

    def address(self, name: str) -> Address:
        return self.proxy.address(name)  # fixed once started

    def execute(self, command: object) -> dict[str, Any]:
        return self.call(lambda proxy: proxy.execute(command))

    def partition(self, link: str | None = None, **selector: Any) -> list[str]:
        return self.call(lambda proxy: proxy.partition(link, **selector))

    def heal(self, link: str | None = None, **selector: Any) -> list[str]:
        return self.call(lambda proxy: proxy.heal(link, **selector))

    def set_delay(self, link: str | None = None, **fields: Any) -> list[str]:
        return self.call(lambda proxy: proxy.set_delay(link, **fields))

    def status(self) -> list[dict[str, Any]]:
        return self.call(lambda proxy: proxy.status())
