"""The SDK's transaction logic, sans I/O (store/client/protocol.py), driven by a script.

Each test plays the driver: it answers the effects the protocol yields (connect, call,
forget a session, sleep) from a table, on a fake clock, and checks what the protocol sent
and what it answered — the rules of the module's doc, one by one.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from store import wire
from store.client.protocol import (
    AwaitOutcome,
    Call,
    ClientProtocol,
    ClientSettings,
    Connect,
    ForgetSession,
    OutcomeWatch,
    Sleep,
    Steps,
)
from store.core.errors import (
    Aborted,
    InvalidRequest,
    OutcomeUnknown,
    ProcedureFailed,
    RolledBack,
    Status,
    Unavailable,
    UnknownProcedure,
    UserAborted,
)
from store.core.partition import Partitioner
from store.core.vclock import VectorClock
from store.protocol import codec
from store.protocol.messages import AwaitOutcomes, Outcome, Outcomes, Submit
from store.rpc import PeerUnavailable, RequestTimeout, SessionRefused

LEADERS = ["leader/0", "leader/1"]


class Driver:
    """Answers effects with ``answer(effect)`` (a value, or an exception to throw in)."""

    def __init__(self, answer: Callable[[Any], Any]) -> None:
        self.answer = answer
        self.now = 100.0
        self.effects: list[Any] = []
        self.protocol = ClientProtocol(
            "c1", LEADERS, Partitioner(2), ClientSettings(timeout_s=5.0, attempt_timeout_s=1.0),
            lambda: self.now, random.Random(1),
        )

    def drive(self, steps: Steps[Any]) -> Any:
        value: Any = None
        error: BaseException | None = None
        for _ in range(1000):  # bounded: a protocol that loops forever fails here
            effect = steps.send(value) if error is None else steps.throw(error)
            self.effects.append(effect)
            value, error = None, None
            if isinstance(effect, Sleep):
                self.now += effect.seconds
                continue
            try:
                value = self.answer(effect)
            except Exception as exc:
                error = exc
                if isinstance(exc, RequestTimeout) and isinstance(effect, Call):
                    self.now += effect.timeout_s
        raise AssertionError("the protocol did not finish in 1000 effects")

    def run(self, steps: Steps[Any]) -> Any:
        try:
            self.drive(steps)
        except StopIteration as stop:
            return stop.value

    def submits(self) -> list[Submit]:
        sent = []
        for effect in self.effects:
            if isinstance(effect, Call) and effect.req_type == wire.SUBMIT:
                message = codec.decode(effect.payload)
                assert isinstance(message, Submit)
                sent.append(message)
        return sent


def outcome(status: Status, result: Any = None, seq: int = 0, detail: str = "") -> bytes:
    return codec.encode(Outcome(seq, status, result, VectorClock({0: 3}), detail))


def answers(*replies: Any) -> Callable[[Any], Any]:
    """Connects succeed; each Call takes the next reply (bytes, or an exception to raise)."""
    queue = list(replies)

    def answer(effect: Any) -> Any:
        if isinstance(effect, Connect | ForgetSession):
            return None
        reply = queue.pop(0)
        if isinstance(reply, BaseException):
            raise reply
        return reply

    return answer


def test_a_lost_answer_is_asked_again_under_the_same_id() -> None:
    driver = Driver(answers(RequestTimeout("lost"), outcome(Status.COMMITTED, [7])))
    result = driver.run(driver.protocol.run(0, "", [[["get", "t/a"]]], False, False))
    assert result.result == [7] and result.status == "committed" and result.attempts == 1
    first, second = driver.submits()
    assert (first.client_id, first.seq) == (second.client_id, second.seq)
    assert not first.want_certified  # a caller of run() does not ask for CERTIFIED
    assert all(e.req_type == wire.SUBMIT for e in driver.effects if isinstance(e, Call))


def test_a_dead_session_is_forgotten_then_reopened_and_the_request_sent_again() -> None:
    driver = Driver(answers(PeerUnavailable("gone"), outcome(Status.COMMITTED, 1)))
    driver.run(driver.protocol.run(1, "p", [], False, False))
    kinds = [type(effect).__name__ for effect in driver.effects]
    assert kinds == ["Connect", "Call", "ForgetSession", "Sleep", "Connect", "Call"]
    assert all(e.address == "leader/1" for e in driver.effects if isinstance(e, Connect | Call))
    assert len({m.seq for m in driver.submits()}) == 1


def test_a_leader_unreachable_from_the_start_is_unavailable_and_nothing_was_sent() -> None:
    def answer(effect: Any) -> Any:
        raise SessionRefused("no")

    driver = Driver(answer)
    with pytest.raises(Unavailable):
        driver.run(driver.protocol.run(0, "p", [], False, False))
    assert driver.submits() == []


def test_a_leader_lost_after_the_request_left_is_an_unknown_outcome_to_resume() -> None:
    sent = []

    def answer(effect: Any) -> Any:
        if isinstance(effect, Call):
            sent.append(effect)
            raise PeerUnavailable("gone")
        if isinstance(effect, Connect) and sent:
            raise PeerUnavailable("still gone")
        return None

    driver = Driver(answer)
    with pytest.raises(OutcomeUnknown) as caught:
        driver.run(driver.protocol.run(0, "p", [], False, False))
    pending = caught.value.txn  # type: ignore[attr-defined]
    first_seq = driver.submits()[0].seq
    assert pending.submit.seq == first_seq
    again = Driver(answers(outcome(Status.COMMITTED, "done")))
    result = again.run(again.protocol.resume(pending, speculative=False))
    assert result.result == "done" and again.submits()[0].seq == first_seq


def test_resuming_while_the_leader_is_unreachable_stays_unknown_never_unavailable() -> None:
    """Unavailable tells the caller the transaction did not run and may run again. A
    resumed one was sent before, so it may have run: an unreachable leader leaves its
    outcome unknown (TPC-C with a killed leader ran payments twice when it did not)."""
    def down(effect: Any) -> Any:
        if isinstance(effect, Connect):
            raise SessionRefused("down")
        raise AssertionError("nothing may be sent to a leader that cannot be reached")

    lost = Driver(answers(PeerUnavailable("gone")))

    def first(effect: Any) -> Any:
        if isinstance(effect, Connect) and lost.effects.count(effect) > 1:
            raise SessionRefused("down")
        return answers(PeerUnavailable("gone"))(effect) if isinstance(effect, Call) else None

    lost.answer = first
    with pytest.raises(OutcomeUnknown) as caught:
        lost.run(lost.protocol.run(0, "p", [], False, False))
    pending = caught.value.txn  # type: ignore[attr-defined]
    again = Driver(down)
    with pytest.raises(OutcomeUnknown):
        again.run(again.protocol.resume(pending, speculative=False))


def test_no_answer_until_the_deadline_is_an_unknown_outcome() -> None:
    driver = Driver(answers(*[RequestTimeout("lost")] * 10))
    with pytest.raises(OutcomeUnknown, match="no answer within the timeout"):
        driver.run(driver.protocol.run(0, "p", [], False, False))
    assert 4 <= len(driver.submits()) <= 6  # 5 s of 1 s attempts


def test_a_conflict_is_retried_under_a_new_id_with_backoff_until_the_limit() -> None:
    driver = Driver(answers(*[outcome(Status.ABORTED)] * 3, outcome(Status.COMMITTED, 2)))
    result = driver.run(driver.protocol.run(0, "p", [], False, False))
    assert result.result == 2 and result.attempts == 4
    assert len({m.seq for m in driver.submits()}) == 4
    assert sum(isinstance(e, Sleep) for e in driver.effects) == 3
    limit = driver.protocol.settings.retries_max
    stubborn = Driver(answers(*[outcome(Status.ABORTED)] * (limit + 1)))
    with pytest.raises(Aborted) as raised:
        stubborn.run(stubborn.protocol.run(0, "p", [], False, False))
    assert len(stubborn.submits()) == limit + 1
    # Issue 15: the error says how many attempts it took, and so do the client's counts.
    assert raised.value.attempts == limit + 1
    assert driver.protocol.stats == {
        "transactions": 1, "attempts": 4, "conflict_retries": 3, "unavailable_retries": 0,
    }
    assert stubborn.protocol.stats["conflict_retries"] == limit


def test_detailed_is_one_request_and_learns_its_certification_time_from_the_commit() -> None:
    """Issue 12: a caller that waits for commit costs one SUBMIT, even when it wants both
    times; the COMMITTED answer says how long it waited after certification."""
    committed = codec.encode(Outcome(0, Status.COMMITTED, [1], VectorClock({0: 3}), "", 50_000_000))
    driver = Driver(lambda effect: committed)

    def slow(effect: Any) -> Any:
        if isinstance(effect, Call):
            driver.now += 0.080  # the answer comes 80 ms after the request
        return committed

    driver.answer = slow
    result = driver.run(driver.protocol.run(0, "p", [], False, True))
    (only,) = driver.submits()
    assert not only.want_certified
    assert result.result == [1] and result.status == "committed"
    assert result.committed_s == pytest.approx(0.080)
    assert result.certified_s == pytest.approx(0.030)


def test_speculative_returns_at_certification() -> None:
    driver = Driver(answers(outcome(Status.CERTIFIED, 5)))
    result = driver.run(driver.protocol.run(0, "p", [], True, False))
    assert result.status == "certified" and result.committed_s is None and result.result == 5


@pytest.mark.parametrize(
    ("status", "error"),
    [
        (Status.USER_ABORTED, UserAborted),
        (Status.INVALID, InvalidRequest),
        (Status.PROCEDURE_FAILED, ProcedureFailed),
        (Status.ROLLED_BACK, RolledBack),
        (Status.UNAVAILABLE, Unavailable),
        (Status.UNKNOWN_PROCEDURE, UnknownProcedure),
    ],
)
def test_each_final_outcome_is_its_typed_error_and_is_not_retried(
    status: Status, error: type[Exception]
) -> None:
    driver = Driver(answers(outcome(status, detail="why")))
    with pytest.raises(error, match="why"):
        driver.run(driver.protocol.run(0, "p", [], False, False))
    assert len(driver.submits()) == 1


def test_an_undecodable_or_foreign_answer_is_an_unknown_outcome() -> None:
    for reply in (b"\xc1garbage", outcome(Status.COMMITTED, seq=999)):
        driver = Driver(answers(reply))
        with pytest.raises(OutcomeUnknown):
            driver.run(driver.protocol.run(0, "p", [], False, False))


def test_routes_pick_the_coordinator() -> None:
    protocol = Driver(answers()).protocol
    assert protocol.shard_for(1) == 1
    assert protocol.shard_for("t/a") == Partitioner(2).shard_of("t/a")
    assert {protocol.shard_for(None) for _ in range(4)} == {0, 1}
    with pytest.raises(InvalidRequest):
        protocol.shard_for(2)


def test_not_a_leader_after_an_earlier_send_is_unknown_not_unavailable() -> None:
    """The first request was lost; the second meets a process that answers "not a leader"
    (the leader restarted with its memory gone). The first may have run, so the outcome is
    unknown and the transaction is not run again under a new id."""
    driver = Driver(answers(
        RequestTimeout("lost"),
        outcome(Status.UNAVAILABLE, detail="not a shard leader (yet)"),
        outcome(Status.COMMITTED, "twice"),
    ))
    with pytest.raises(OutcomeUnknown):
        driver.run(driver.protocol.run(0, "p", [], False, False))
    assert len({s.seq for s in driver.submits()}) == 1  # one id: never run again


def test_a_coordinators_unavailable_after_a_resend_is_still_unavailable() -> None:
    """A coordinator that gave up an undecided transaction answers Unavailable under the
    transaction's own id: it knows it did not run, whatever was sent before."""
    driver = Driver(answers(RequestTimeout("lost"), RequestTimeout("lost")))
    seq = driver.protocol.new_pending(0, "p", []).submit.seq + 1  # the id run() will draw
    driver.answer = answers(
        RequestTimeout("lost"), outcome(Status.UNAVAILABLE, seq=seq, detail="gave up"),
    )
    driver.protocol.cm_members = []
    with pytest.raises(Unavailable):
        driver.run(driver.protocol.run(0, "p", [], False, False))


def test_not_a_leader_on_the_first_send_is_unavailable() -> None:
    driver = Driver(answers(outcome(Status.UNAVAILABLE, detail="not a shard leader (yet)")))
    driver.protocol.cm_members = []  # no map to refresh: the error reaches the caller
    with pytest.raises(Unavailable):
        driver.run(driver.protocol.run(0, "p", [], False, False))


def test_a_follower_that_cannot_serve_a_snapshot_read_now_says_why() -> None:
    """A restarted follower still copying its state refuses snapshot reads with a typed
    Unavailable that names the reason (it used to answer nothing a client could decode)."""
    from store.protocol.messages import SnapshotRead

    refusal = outcome(Status.UNAVAILABLE, detail="f/0 does not serve SnapshotRead now: rejoining")
    driver = Driver(answers(refusal))
    with pytest.raises(Unavailable, match="rejoining"):
        driver.run(driver.protocol.snapshot(0, "f/0", SnapshotRead(1, ["t/a"], [])))


def test_a_request_over_the_message_limit_is_invalid_at_once_and_nothing_is_sent() -> None:
    """Issue 13: a 9 MB transaction used to wait out the whole timeout and end
    OutcomeUnknown although the RPC core had refused to send it."""
    driver = Driver(answers())
    big = "x" * (9 << 20)
    with pytest.raises(InvalidRequest, match=r"more than the RPC message limit of 8,388,608"):
        driver.drive(driver.protocol.run(0, "", [[["put", "t/a", big]]], False, False))
    assert not [effect for effect in driver.effects if isinstance(effect, Call | Connect)]
    assert driver.now == 100.0  # at once: no timeout waited


def test_a_message_too_large_from_the_rpc_core_is_invalid_not_unknown() -> None:
    from store.rpc import MessageTooLarge

    driver = Driver(answers(MessageTooLarge("payload above msg_size_max")))
    with pytest.raises(InvalidRequest, match="too large"):
        driver.drive(driver.protocol.run(0, "p", [], False, False))
    assert len(driver.submits()) == 1


# ---- waiting for pipelined commits together (AwaitOutcome, OutcomeWatch) --------------------


def _outcomes(finals: list[Outcome], unknown: list[int]) -> bytes:
    return codec.encode(Outcomes(finals, unknown))


def _final(seq: int, status: Status = Status.COMMITTED) -> Outcome:
    return Outcome(seq, status, seq * 10, VectorClock({0: seq}), "")


def test_waiters_at_one_leader_share_one_request_and_the_rest_are_asked_for_again() -> None:
    watch = OutcomeWatch("c1")
    heard: dict[int, Outcome | None] = {}
    first = watch.wait("leader/0", 3, lambda o: heard.__setitem__(3, o))
    assert watch.wait("leader/0", 1, lambda o: heard.__setitem__(1, o)) is None  # one on the wire
    assert watch.wait("leader/0", 2, lambda o: heard.__setitem__(2, o)) is None
    assert first is not None
    asked = codec.decode(first)
    assert isinstance(asked, AwaitOutcomes) and asked.seqs == [3] and asked.client_id == "c1"
    following = watch.answered("leader/0", _outcomes([_final(3)], []))
    assert heard == {3: _final(3)}
    assert following is not None
    asked = codec.decode(following)
    assert isinstance(asked, AwaitOutcomes) and asked.seqs == [1, 2]  # both, in one request
    assert watch.answered("leader/0", _outcomes([_final(2, Status.ROLLED_BACK)], [1])) is None
    assert heard[2] == _final(2, Status.ROLLED_BACK)
    assert heard[1] is None  # the leader does not know it: its Submit asks
    assert watch.requests == 2


def test_a_failed_await_lets_every_waiter_there_go_to_its_submit() -> None:
    watch = OutcomeWatch("c1")
    heard: dict[str, Outcome | None] = {}
    assert watch.wait("leader/0", 1, lambda o: heard.__setitem__("0/1", o)) is not None
    watch.wait("leader/0", 2, lambda o: heard.__setitem__("0/2", o))
    assert watch.wait("leader/1", 1, lambda o: heard.__setitem__("1/1", o)) is not None
    assert watch.answered("leader/0", None) is None  # timed out, or its session died
    assert heard == {"0/1": None, "0/2": None}  # the other leader's waiter still waits


@pytest.mark.parametrize(
    "answer",
    [
        _outcomes([], []),  # says nothing: no loop
        outcome(Status.INVALID, detail="unknown request type"),  # a server without AWAIT
        b"\xc1garbage",
    ],
)
def test_an_await_answer_that_resolves_nothing_sends_every_waiter_to_its_submit(answer: bytes) -> None:
    watch = OutcomeWatch("c1")
    heard: dict[int, Outcome | None] = {}
    watch.wait("leader/0", 1, lambda o: heard.__setitem__(1, o))
    assert watch.answered("leader/0", answer) is None
    assert heard == {1: None}


def test_a_forgotten_waiter_is_not_asked_for_again() -> None:
    watch = OutcomeWatch("c1")
    heard: list[Outcome | None] = []
    then = heard.append
    watch.wait("leader/0", 1, then)
    watch.wait("leader/0", 2, then)
    watch.forget("leader/0", 2, then)
    following = watch.answered("leader/0", _outcomes([], [3]))  # says something: goes on
    assert following is not None
    asked = codec.decode(following)
    assert isinstance(asked, AwaitOutcomes) and asked.seqs == [1]
    assert watch.answered("leader/0", _outcomes([_final(1)], [])) is None
    assert heard == [_final(1)]


def test_a_pipelined_commit_is_awaited_without_its_submit_when_the_watch_answers() -> None:
    def answer(effect: Any) -> Any:
        if isinstance(effect, Connect | ForgetSession):
            return None
        if isinstance(effect, AwaitOutcome):
            assert effect.address == "leader/0" and effect.seq == 1 and effect.timeout_s > 0
            return Outcome(1, Status.COMMITTED, None, VectorClock({0: 4}), "", 7)
        return outcome(Status.CERTIFIED, 5, seq=1)

    driver = Driver(answer)
    certified, pending = driver.run(driver.protocol.run_pipelined(0, "p", []))
    assert certified.status == "certified" and pending is not None
    committed = driver.run(driver.protocol.await_commit(pending, certified))
    assert committed.status == "committed" and committed.result == 5  # the certified result
    assert len(driver.submits()) == 1  # one request for the transaction


def test_a_pipelined_commit_the_watch_says_nothing_of_is_asked_with_its_submit() -> None:
    def answer(effect: Any) -> Any:
        if isinstance(effect, Connect | ForgetSession):
            return None
        if isinstance(effect, AwaitOutcome):
            return None
        message = codec.decode(effect.payload)
        assert isinstance(message, Submit)
        status = Status.CERTIFIED if message.want_certified else Status.ROLLED_BACK
        return outcome(status, 5, seq=message.seq)

    driver = Driver(answer)
    certified, pending = driver.run(driver.protocol.run_pipelined(0, "p", []))
    with pytest.raises(RolledBack):
        driver.run(driver.protocol.await_commit(pending, certified))
    sent = driver.submits()
    assert [s.want_certified for s in sent] == [True, False] and sent[0].seq == sent[1].seq


def test_operation_lists_are_stored_without_touching_the_callers_and_bad_ones_are_named() -> None:
    """``stored_ops`` packs tuple keys (and a range's upper bound) into their stored form in
    copies; whatever is malformed, an operation name that is not even hashable included, is
    left for OpList to refuse with InvalidRequest (it was a bare TypeError)."""
    from store.client.protocol import stored_ops
    from store.core.errors import InvalidRequest
    from store.core.keys import to_stored
    from store.core.oplist import OpList
    from store.core.settings import DEFAULT_SETTINGS

    ops = [["get", ("t", 1)], ("scan", ("t", 1), ("t", 9), 10), ["put", "plain", 5]]
    stored = stored_ops(ops)
    assert stored == [
        ["get", to_stored(("t", 1))],
        ["scan", to_stored(("t", 1)), to_stored(("t", 9)), 10],
        ["put", "plain", 5],
    ]
    assert ops[0] == ["get", ("t", 1)]  # the caller's list is as it was
    OpList(stored, DEFAULT_SETTINGS)
    for bad in ([[["get"], "k"]], [[{"op": 1}, "k"]], [[]], ["get"], [("nope", "k")]):
        with pytest.raises(InvalidRequest):
            OpList(stored_ops(bad), DEFAULT_SETTINGS)
    with pytest.raises(InvalidRequest, match="operations must be a list"):
        stored_ops(("get", "k"))


# Lists of well-formed operations of every kind the server knows (the SDK's own path takes
# gets, puts, deletes and increments of plain keys) with at most one operation from a wider
# set among them: bad names, keys, values and arities, tuple keys, scans.
_KEY = st.sampled_from(["t/a", "t/b", "é" * 255])
_VALUE = st.sampled_from([0, 7, None, "v", [1, 2], 2.5, True])
_GOOD = st.one_of(
    st.tuples(st.sampled_from(["get", "delete"]), _KEY).map(list),
    st.tuples(st.just("increment"), _KEY, st.sampled_from([1, -5])).map(list),
    st.tuples(st.just("put"), _KEY, _VALUE),
)
_NAMES = st.sampled_from(["get", "put", "delete", "increment", "scan", "cas", "append", "keys", "nope", 7])
_COMMON = st.sampled_from(["get", "put", "delete", "increment"])
_KEYS = st.sampled_from(
    ["t/a", "", "\x00x", "é" * 257, "é" * 600, "k" * 1025, "k" * 256, ("t", 1), ["t", 2], 5, None]
)
_ARGS = st.sampled_from([1, True, None, "v", "x" * ((1 << 20) + 1), [1, 2], 2.5, 10, -10])
_ANY = st.one_of(  # one thing changed from a good operation, or nothing like one
    st.tuples(st.sampled_from(["put", "increment"]), _KEY, _ARGS),
    st.tuples(_NAMES, _KEY).map(list),
    st.tuples(_NAMES, _KEY, _ARGS),
    st.tuples(_COMMON, _KEYS).map(list),
    st.tuples(_COMMON, _KEYS, _VALUE).map(list),
    st.tuples(_NAMES, _KEY, _ARGS, _ARGS).map(list),
    st.lists(_ARGS, max_size=3),
    st.tuples(st.just("get")),
    _ARGS,
)
_OPS = st.tuples(st.lists(_GOOD, max_size=4), st.lists(_ANY, max_size=1), st.integers(0, 4)).map(
    lambda parts: parts[0][: parts[2]] + parts[1] + parts[0][parts[2] :]
)


@settings(max_examples=1000, deadline=None)
@given(ops=_OPS)
@example(ops=[["get", "t/a"], ("put", "t/a", "x" * ((1 << 20) + 1))])  # too large a value
@example(ops=[["increment", "t/a", "1"]])  # not an integer
@example(ops=[["increment", "t/a", True]])
@example(ops=[["get", "é" * 600]])  # fewer characters than bytes allowed, more bytes
@example(ops=[["delete", ""]])
@example(ops=[["scan", "t/a"]])
@example(ops=[["get", "t/a"], ["scan", "t/a", "t/b", 5]])
def test_an_operation_list_is_checked_before_sending_as_the_server_checks_it(ops: list[Any]) -> None:
    """``checked_ops`` (the SDK's check before any request, with a path of its own for the
    common operations) accepts exactly what the server's OpList accepts and refuses the rest
    with OpList's own error, and says whether the list scans."""
    from store.client.protocol import checked_ops, stored_ops
    from store.core.errors import InvalidRequest
    from store.core.oplist import OpList
    from store.core.settings import DEFAULT_SETTINGS

    try:
        stored = stored_ops(ops)
        expected: Any = (stored, bool(OpList(stored, DEFAULT_SETTINGS).batch.scans))
    except InvalidRequest as exc:
        expected = str(exc)
    try:
        stored, scans = checked_ops(ops, DEFAULT_SETTINGS)
        # an operation may stay a tuple: the wire carries tuples and lists alike
        got: Any = ([list(op) if type(op) is tuple else op for op in stored], scans)
    except InvalidRequest as exc:
        got = str(exc)
    assert got == expected


def test_a_transaction_result_is_read_only_and_equal_by_its_fields() -> None:
    from store.client.protocol import TxnResult

    vc = VectorClock({})
    result = TxnResult([1], "committed", vc, 0.001, 0.05, 2, ("c1", 7))
    assert (result.result, result.status, result.vc, result.certified_s, result.committed_s,
            result.attempts, result.txn) == ([1], "committed", vc, 0.001, 0.05, 2, ("c1", 7))
    for name in ("result", "status", "vc", "certified_s", "committed_s", "attempts", "txn"):
        with pytest.raises(AttributeError):
            setattr(result, name, None)
    twin = TxnResult([1], "committed", vc, 0.001, 0.05, 2, ("c1", 7))
    assert result == twin and result != TxnResult([1], "certified", vc, 0.001, None, 2)
    assert TxnResult(1, "committed", vc, 0.0, 0.0, 1).txn == ("", 0)
    assert hash(TxnResult(1, "committed", vc, 0.0, 0.0, 1)) == hash(
        TxnResult(1, "committed", vc, 0.0, 0.0, 1))
    assert "status='committed'" in repr(result)
    # The protocol's effects compare by their fields and, as the dataclasses they were, are
    # not hashable.
    assert Connect("leader/0", 1.0) == Connect("leader/0", 1.0) != Connect("leader/1", 1.0)
    assert Sleep(0.5) != Connect("leader/0", 0.5) and repr(Sleep(0.5)) == "Sleep(0.5)"
    with pytest.raises(TypeError, match="unhashable"):
        hash(Connect("leader/0", 1.0))
