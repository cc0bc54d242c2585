"""A follower's snapshot on disk (store/node/snapshot.py) and the restart that goes on from
it (ShardFollower.restore): written whole or not at all, checked when read, and restored
only by a replica that cannot have led its shard since it was taken."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from store.core.follower import ShardFollower
from store.core.paxos import Accept, Acceptor, Ballot, Prepare
from store.core.transfer import FollowerState
from store.node.snapshot import SnapshotCorrupt, SnapshotWriter, read_snapshot, snapshot_path
from tests.core.test_transfer import BATCH, sample_state

ME = "a"  # the state's map: shard 0 led by "b", followed by "a" and "c"


def _write(directory: Path, state: FollowerState) -> int:
    loop = asyncio.new_event_loop()
    failures: list[BaseException] = []
    writer = SnapshotWriter(directory, loop, fsync=True, on_fatal=failures.append)
    done = loop.create_future()
    writer.start(state, done.set_result)
    slot = loop.run_until_complete(asyncio.wait_for(done, 10))
    writer.close()
    loop.close()
    assert not failures and not writer.writing
    return int(slot)


def test_a_snapshot_reads_back_as_the_state_it_was(tmp_path: Path) -> None:
    assert read_snapshot(tmp_path) is None
    state = sample_state()
    assert _write(tmp_path, state) == state.slot
    read = read_snapshot(tmp_path)
    assert read is not None
    assert (read.slot, read.vw, read.promised, read.recent) == (
        state.slot, state.vw, state.promised, state.recent
    )
    assert read.chains == list(state.chains)
    assert not (tmp_path / "snapshot.tmp").exists()


def test_a_new_snapshot_replaces_the_old_whole_and_a_left_temp_file_is_ignored(tmp_path: Path) -> None:
    state = sample_state()
    _write(tmp_path, state)
    state.slot = 40
    _write(tmp_path, state)
    (tmp_path / "snapshot.tmp").write_bytes(b"half of a snapshot a crash cut short")
    read = read_snapshot(tmp_path)
    assert read is not None and read.slot == 40


@pytest.mark.parametrize("where", ["header", "middle", "end"])
def test_a_flipped_byte_or_a_cut_file_is_refused_by_name(tmp_path: Path, where: str) -> None:
    _write(tmp_path, sample_state())
    path = snapshot_path(tmp_path)
    data = bytearray(path.read_bytes())
    if where == "end":
        data = data[:-3]
    else:
        data[6 if where == "header" else len(data) // 2] ^= 0x20
    path.write_bytes(bytes(data))
    with pytest.raises(SnapshotCorrupt, match=str(path)):
        read_snapshot(tmp_path)


def _logged_acceptor(promised_to: str) -> Acceptor:
    acceptor = Acceptor.recover(0, [
        Prepare(0, Ballot(2, promised_to), 0),
        Accept(0, Ballot(2, promised_to), 13, BATCH, 0),
    ])
    return acceptor


def test_a_restored_follower_goes_on_from_its_snapshot_with_its_logged_votes() -> None:
    state = sample_state()
    acceptor = _logged_acceptor("b")
    assert ShardFollower.may_restore(state, acceptor, ME)
    follower = ShardFollower(0, ME, rejoining=True, acceptor=acceptor)
    follower.restore(state)
    assert not follower.rejoining and follower.voting
    assert follower.stream.learner.delivered_through == state.slot
    assert follower.stream.acceptor is acceptor and acceptor.accepted(13) == (Ballot(2, "b"), BATCH)
    assert follower.vw == state.vw and follower.epoch == 1
    assert follower.store.latest("t/a") is not None


def test_a_replica_that_may_have_led_since_its_snapshot_does_not_restore_it() -> None:
    state = sample_state()
    # Its last promise was to its own ballot: it took the shard over after the snapshot.
    assert not ShardFollower.may_restore(state, _logged_acceptor(ME), ME)
    # The snapshot's map names it leader.
    assert not ShardFollower.may_restore(state, _logged_acceptor("b"), "b")
    # No map to say who leads.
    state.cluster_map = None
    assert not ShardFollower.may_restore(state, _logged_acceptor("b"), ME)


def test_serve_refuses_a_corrupt_snapshot_or_a_past_without_rejoin(tmp_path: Path) -> None:
    """``meridian serve`` on a data directory: a snapshot that fails its check stops the
    process before it serves, naming the file; a healthy one without ``--rejoin`` is a
    process with a past started as a new member, refused with the reason."""
    import subprocess
    import sys

    from store import config as config_module
    from tests.cluster.conftest import write_cluster_file

    path = write_cluster_file(tmp_path, shards=1)
    config = config_module.load(path)
    directory = config.process_data_dir(config.node("leader", 0))
    directory.mkdir(parents=True)
    _write(directory, sample_state())

    def serve(*extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "store.cli", "serve", "--config", str(path), "--shard", "0",
             "--role", "leader", *extra],
            capture_output=True, text=True, timeout=60, check=False,
        )

    refused = serve()
    assert refused.returncode != 0 and "--rejoin" in refused.stderr, refused.stderr
    data = bytearray(snapshot_path(directory).read_bytes())
    data[len(data) // 2] ^= 0x01
    snapshot_path(directory).write_bytes(bytes(data))
    corrupt = serve("--rejoin")
    assert corrupt.returncode != 0, corrupt.stderr
    assert "corrupt data, not starting" in corrupt.stderr and str(snapshot_path(directory)) in corrupt.stderr
    assert "Traceback" not in corrupt.stderr
