"""A cluster with ``[security]`` on (issue 13; docs/security.md): ``meridian certs`` makes
the CA, each process's certificate and the secret; replication between regions runs over
mutual TLS; a client without the cluster secret, or with another one, is refused with a
clear error, the servers say so in their logs, and nothing it sent runs."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from store import config as config_module
from store.client import Client
from store.core.errors import Unavailable
from store.node.up import ProcessCluster
from tests.cluster.conftest import _ports, run
from tests.conftest import REPO

DEADLINE_S = 20.0


def _cluster_file(directory: Path, secret_file: str = "certs/cluster.secret") -> Path:
    port = next(_ports)
    text = f"""
[cluster]
name = "secure"
run_dir = "{directory / 'run'}"
python_path = ["{REPO}"]
[client]
timeout_s = 3.0
[[regions]]
name = "us"
[[regions]]
name = "eu"
[[regions]]
name = "ap"
[[shards]]
leader = "127.0.0.1:{port}"
region = "us"
followers = [{{ region = "eu", address = "127.0.0.2:{port}" }}, {{ region = "ap", address = "127.0.0.3:{port}" }}]
[security]
tls = true
ca = "certs/ca.pem"
cert_dir = "certs"
secret_file = "{secret_file}"
"""
    path = directory / "cluster.toml"
    path.write_text(text)
    return path


def test_certs_tls_replication_and_the_secret(tmp_path: Path) -> None:
    path = _cluster_file(tmp_path)
    made = subprocess.run(
        [sys.executable, "-m", "store.cli", "certs", "--config", str(path)],
        cwd=REPO, capture_output=True, text=True, timeout=60, check=False,
    )
    assert made.returncode == 0, made.stderr
    for name in ("ca.pem", "ca.key", "shard-0.pem", "shard-0.key", "shard-0-eu.pem",
                 "shard-0-ap.key", "cluster.secret"):
        assert str(tmp_path / "certs" / name) in made.stdout, name
    assert oct((tmp_path / "certs" / "shard-0.key").stat().st_mode & 0o777) == "0o600"
    config = config_module.load(path)
    cluster = ProcessCluster(config)
    cluster.start()
    try:
        cluster.wait_ready()

        async def good() -> None:
            async with await Client.connect(config) as client:
                for i in range(20):
                    await client.put(f"s/{i}", i)
                deadline = time.monotonic() + DEADLINE_S
                while True:  # the followers replicate over mutual TLS
                    snapshots = [
                        await client.read_snapshot([f"s/{i}" for i in range(20)], region=r)
                        for r in ("eu", "ap")
                    ]
                    if all(s.values == {f"s/{i}": i for i in range(20)} for s in snapshots):
                        return
                    assert time.monotonic() < deadline, snapshots
                    await _sleep()

        run(good())

        # The same cluster file without the secret, then with another one.
        stranger = tmp_path / "stranger"
        stranger.mkdir()
        (stranger / "other.secret").write_text("ab" * 32 + "\n")
        for secret_file in (None, str(stranger / "other.secret")):
            text = path.read_text().replace('secret_file = "certs/cluster.secret"\n', "")
            if secret_file is not None:
                text += f'secret_file = "{secret_file}"\n'
            text = text.replace('cert_dir = "certs"', f'cert_dir = "{tmp_path / "certs"}"')
            text = text.replace('ca = "certs/ca.pem"', f'ca = "{tmp_path / "certs" / "ca.pem"}"')
            (stranger / "cluster.toml").write_text(text)
            other = config_module.load(stranger / "cluster.toml")

            async def refused(other: config_module.ClusterConfig = other) -> None:
                async with await Client.connect(other, connect_timeout_s=1.0) as client:
                    with pytest.raises(Unavailable, match="cluster secret"):
                        await client.put("s/intruder", 1)

            run(refused())

        async def untouched() -> object:
            async with await Client.connect(config) as client:
                return await client.get("s/intruder")

        assert run(untouched()) is None  # nothing the stranger sent ran
        log = config.run_dir / "shard-0.log"
        deadline = time.monotonic() + DEADLINE_S
        while "without the cluster secret" not in log.read_text():
            assert time.monotonic() < deadline, log.read_text()[-2000:]
            time.sleep(0.1)
        refusals = [
            json.loads(line) for line in log.read_text().splitlines()
            if "without the cluster secret" in line
        ]
        assert sum(r["count"] for r in refusals) >= 2
    finally:
        cluster.stop()


async def _sleep() -> None:
    import asyncio

    await asyncio.sleep(0.1)


def test_tls_without_its_files_is_a_clear_error(tmp_path: Path) -> None:
    path = _cluster_file(tmp_path)  # no meridian certs: the files do not exist
    done = subprocess.run(
        [sys.executable, "-m", "store.cli", "serve", "--config", str(path), "--shard", "0"],
        cwd=REPO, capture_output=True, text=True, timeout=60, check=False,
    )
    assert done.returncode != 0
    assert "secret_file" in done.stderr or "meridian certs" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
