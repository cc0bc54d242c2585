"""The asyncio driver of the SDK (``store.client.client.Client``) on a scripted RPC: how a
pipelined transaction's commit is waited for. The commit waits as a waiter of the client's
``OutcomeWatch`` (no task of its own) while the AWAIT answers come; when an answer says
nothing of it, a task takes the wait on and asks by its Submit."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from store import wire
from store.client import Client
from store.client.protocol import ClientSettings
from store.core.errors import RolledBack, Status
from store.core.partition import Partitioner
from store.core.vclock import VectorClock
from store.protocol import codec
from store.protocol.messages import AwaitOutcomes, Outcome, Outcomes, Submit

VC = VectorClock({0: 5})


class _Session:
    error = None


class ScriptedRpc:
    """Answers SUBMIT with CERTIFIED (COMMITTED when the client does not take CERTIFIED),
    and AWAIT with ``final`` for the seqs it names (all unknown when ``final`` is None),
    each once ``release`` is set."""

    def __init__(self, final: Status | None) -> None:
        self.final = final
        self.release = asyncio.Event()
        self.sent: list[tuple[int, Any]] = []

    async def call(self, session: Any, req_type: int, payload: bytes, timeout: Any = None) -> bytes:
        message = codec.decode(payload)
        self.sent.append((req_type, message))
        if req_type == wire.SUBMIT:
            assert isinstance(message, Submit)
            status = Status.CERTIFIED if message.want_certified else Status.COMMITTED
            return codec.encode(Outcome(message.seq, status, 7, VC, ""))
        assert req_type == wire.AWAIT and isinstance(message, AwaitOutcomes)
        await self.release.wait()
        if self.final is None:
            return codec.encode(Outcomes([], message.seqs))
        detail = "" if self.final == Status.COMMITTED else "rolled back by recovery"
        return codec.encode(Outcomes([Outcome(s, self.final, None, VC, detail) for s in message.seqs], []))

    def close(self) -> None:
        pass

    def submits(self) -> list[Submit]:
        return [m for t, m in self.sent if t == wire.SUBMIT]


async def _client(rpc: ScriptedRpc) -> Client:
    client = Client([("127.0.0.1", 1)], Partitioner(1), ClientSettings(timeout_s=2.0))
    client._rpc.close()
    client._rpc = rpc  # type: ignore[assignment]
    client._sessions["127.0.0.1:1"] = _Session()  # type: ignore[assignment]
    return client


async def _settle() -> None:
    for _ in range(10):
        await asyncio.sleep(0)


def test_a_pipelined_commit_waits_without_a_task_and_shares_one_await() -> None:
    async def scenario() -> None:
        rpc = ScriptedRpc(Status.COMMITTED)
        client = await _client(rpc)
        pipelined = [await client.run_pipelined("", [["put", f"k{i}", i]]) for i in range(5)]
        assert all(certified.status == "certified" for certified, _ in pipelined)
        await _settle()
        # One AWAIT on the wire for the five, and only its task besides this one: none per
        # transaction.
        assert len(client._await_tasks) == 1
        assert len(asyncio.all_tasks()) == 2
        rpc.release.set()
        results = await asyncio.wait_for(asyncio.gather(*(f for _, f in pipelined)), 5)
        assert [r.status for r in results] == ["committed"] * 5
        assert [r.result for r in results] == [7] * 5  # the certified answer's result
        assert len(rpc.submits()) == 5  # one request per transaction
        awaited = [m.seqs for t, m in rpc.sent if t == wire.AWAIT]
        assert sorted(s for seqs in awaited for s in seqs) == [s.seq for s in rpc.submits()]
        await _settle()
        assert not client._await_tasks

    asyncio.run(scenario())


def test_a_commit_the_await_says_nothing_of_is_asked_by_its_submit() -> None:
    async def scenario() -> None:
        rpc = ScriptedRpc(None)
        rpc.release.set()
        client = await _client(rpc)
        _, commit = await client.run_pipelined("", [["put", "k", 1]])
        result = await asyncio.wait_for(commit, 5)
        assert result.status == "committed" and result.result == 7
        first, again = rpc.submits()
        assert (first.seq, first.want_certified) == (again.seq, True) and not again.want_certified
        await _settle()
        assert not client._await_tasks

    asyncio.run(scenario())


def test_a_rolled_back_commit_raises_from_the_future() -> None:
    async def scenario() -> None:
        rpc = ScriptedRpc(Status.ROLLED_BACK)
        rpc.release.set()
        client = await _client(rpc)
        _, commit = await client.run_pipelined("", [["put", "k", 1]])
        with pytest.raises(RolledBack):
            await asyncio.wait_for(commit, 5)

    asyncio.run(scenario())


def test_a_cancelled_commit_future_asks_no_further() -> None:
    async def scenario() -> None:
        rpc = ScriptedRpc(None)
        client = await _client(rpc)
        _, commit = await client.run_pipelined("", [["put", "k", 1]])
        await _settle()
        commit.cancel()
        rpc.release.set()  # the AWAIT answer says nothing of it: no Submit follows now
        await _settle()
        assert len(rpc.submits()) == 1
        assert commit.cancelled()

    asyncio.run(scenario())
