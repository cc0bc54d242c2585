"""Cluster files (TOML, under ``cluster/``): the topology the servers, ``meridian up`` and
the SDK share.

    [cluster]
    name = "local"
    run_dir = "../runs/local"              # logs; relative to this file
    python_path = [".."]                   # added to sys.path of servers (for procedures)
    procedures = ["store.sim.workloads:register_bank"]   # module:function(procedures)
    partitioner = "hash"                   # or "prefix" (table/<n>/... -> shard n mod S)

    [settings]                             # overrides of store.core.settings.Settings
    peer_retry_ns = 200_000_000

    [[regions]]
    name = "us"

    [[shards]]
    leader = "127.0.0.1:7100"              # host:port of the shard leader's RPC endpoint
    region = "us"
    followers = [{ region = "eu", address = "127.0.0.2:7100" }]

    [[cm]]                                 # configuration manager: one member per region
    region = "us"                          # (needed for failover; docs/recovery.md)
    address = "127.0.0.1:7300"

Shards are numbered in file order. Every field is checked; a bad file raises
``ConfigError`` naming the field.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from store.core.partition import Partitioner, PrefixPartitioner
from store.core.settings import DEFAULT_SETTINGS, Settings
from store.rpc.settings import RpcSettings

# Meridian's RPC sessions, servers' and clients' alike (both ends of a session must agree on
# its window). eRPC's 8 outstanding requests per session is too few here: a client waiting
# for a commit holds a request for a wide-area round trip, and with 8 slots those waits
# would queue every new transaction behind them.
# sessions_max: a server's session table holds one session per client (every SDK Client is
# one) and per peer; sessions of processes that went away stay until they time out.
MERIDIAN_RPC_SETTINGS = RpcSettings(
    session_credits=64, session_req_window=64, server_credits_max=256 * 64, sessions_max=2048
)


class ConfigError(ValueError):
    """The cluster file is malformed."""


@dataclass(frozen=True)
class ShardConfig:
    shard: int
    leader: tuple[str, int]
    region: str
    followers: tuple[tuple[str, tuple[str, int]], ...] = ()

    @property
    def leader_address(self) -> str:
        return f"{self.leader[0]}:{self.leader[1]}"


@dataclass(frozen=True)
class WanConfig:
    """Wide-area emulation: every inter-region replication connection goes through one
    ``meridian wan-proxy`` with this round trip (DESIGN.md §2; issue 5)."""

    rtt_ms: float
    jitter_ms: float
    port_base: int
    control: tuple[str, int]


@dataclass(frozen=True)
class ReplicaNode:
    """One server process: a shard's leader or one of its followers, or a configuration
    manager member (role "cm", shard -1)."""

    role: str  # "leader", "follower" or "cm"
    shard: int
    region: str
    rpc: tuple[str, int]

    @property
    def address(self) -> str:
        return f"{self.rpc[0]}:{self.rpc[1]}"


@dataclass(frozen=True)
class ClusterConfig:
    name: str
    path: Path | None
    run_dir: Path
    python_path: tuple[Path, ...]
    procedures: tuple[str, ...]
    partitioner_kind: str
    shards: tuple[ShardConfig, ...]
    regions: tuple[str, ...]
    settings: Settings = field(default=DEFAULT_SETTINGS)
    client: dict[str, Any] = field(default_factory=dict)
    replication_port_offset: int = 1000
    wan: WanConfig | None = None
    stream: dict[str, Any] = field(default_factory=dict)
    rpc: RpcSettings = MERIDIAN_RPC_SETTINGS
    cm: tuple[tuple[str, tuple[str, int]], ...] = ()

    def nodes(self) -> list[ReplicaNode]:
        """Every server process: the leaders, then the followers, shard by shard, then the
        configuration manager's members."""
        nodes = [ReplicaNode("leader", s.shard, s.region, s.leader) for s in self.shards]
        for shard in self.shards:
            nodes += [ReplicaNode("follower", shard.shard, r, a) for r, a in shard.followers]
        return nodes + self.cm_nodes()

    def cm_nodes(self) -> list[ReplicaNode]:
        return [ReplicaNode("cm", -1, region, address) for region, address in self.cm]

    def cm_addresses(self) -> list[str]:
        return [node.address for node in self.cm_nodes()]

    def shard_nodes(self, shard: int) -> list[ReplicaNode]:
        """Every replica of one shard: its first leader, then its followers."""
        config = self.shards[shard]
        return [ReplicaNode("leader", shard, config.region, config.leader)] + [
            ReplicaNode("follower", shard, region, address) for region, address in config.followers
        ]

    def peers(self, node: ReplicaNode) -> list[ReplicaNode]:
        """The processes ``node`` exchanges Paxos messages with: every other replica of its
        shard (any of them may lead it after a failover), or the other CM members."""
        group = self.cm_nodes() if node.role == "cm" else self.shard_nodes(node.shard)
        return [peer for peer in group if peer.address != node.address]

    def node(self, role: str, shard: int, region: str | None = None) -> ReplicaNode:
        for node in self.nodes():
            if node.role == role and node.shard == shard and (region is None or node.region == region):
                return node
        raise ConfigError(f"no {role} of shard {shard}" + (f" in {region}" if region else ""))

    def replication_listen(self, node: ReplicaNode) -> tuple[str, int]:
        return node.rpc[0], node.rpc[1] + self.replication_port_offset

    def wan_links(self) -> list[tuple[str, tuple[str, int], tuple[str, int], str, str, str]]:
        """(name, listen, target, source host, from address, to address) for each direction
        between two Paxos peers in different regions (every pair of a shard's replicas, every
        pair of CM members), when a wan section is configured."""
        assert self.wan is not None
        links = []
        port = self.wan.port_base
        groups = [self.shard_nodes(shard.shard) for shard in self.shards] + [self.cm_nodes()]
        for group in groups:
            for src in group:
                for dst in group:
                    if src.region == dst.region:
                        continue
                    label = "cm" if src.role == "cm" else str(src.shard)
                    links.append((
                        f"{src.region}-{dst.region}/{label}",
                        (src.rpc[0], port),
                        self.replication_listen(dst),
                        src.rpc[0],
                        src.address,
                        dst.address,
                    ))
                    port += 1
        return links

    def replication_routes(self, node: ReplicaNode) -> dict[str, tuple[str, int]]:
        """Where ``node`` dials each peer it sends Paxos messages to (through the wan proxy
        between regions, when one is configured)."""
        peers = self.peers(node)
        if self.wan is None:
            return {peer.address: self.replication_listen(peer) for peer in peers}
        by_pair = {(src, dst): listen for _, listen, _, _, src, dst in self.wan_links()}
        return {
            peer.address: by_pair.get((node.address, peer.address), self.replication_listen(peer))
            for peer in peers
        }

    def partitioner(self) -> Partitioner:
        if self.partitioner_kind == "prefix":
            return PrefixPartitioner(len(self.shards))
        return Partitioner(len(self.shards))

    def leader_addresses(self) -> list[str]:
        return [shard.leader_address for shard in self.shards]


def parse_address(text: object, what: str) -> tuple[str, int]:
    if not isinstance(text, str) or text.count(":") != 1:
        raise ConfigError(f"{what}: expected 'host:port', got {text!r}")
    host, port = text.split(":")
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"{what}: bad port in {text!r}")
    return host, int(port)


def load(path: str | Path) -> ClusterConfig:
    path = Path(path).resolve()
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"no cluster file at {path}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    return from_dict(data, path)


def from_dict(data: dict[str, Any], path: Path | None = None) -> ClusterConfig:
    base = path.parent if path is not None else Path.cwd()
    cluster = data.get("cluster", {})
    if not isinstance(cluster, dict):
        raise ConfigError("[cluster] must be a table")
    regions = tuple(r.get("name", "") for r in data.get("regions", [{"name": "local"}]))
    if not regions or not all(isinstance(r, str) and r for r in regions):
        raise ConfigError("[[regions]] need a name each")
    raw_shards = data.get("shards")
    if not isinstance(raw_shards, list) or not raw_shards:
        raise ConfigError("at least one [[shards]] entry is needed")
    shards = []
    for number, raw in enumerate(raw_shards):
        if not isinstance(raw, dict):
            raise ConfigError(f"shards[{number}] must be a table")
        region = raw.get("region", regions[0])
        if region not in regions:
            raise ConfigError(f"shards[{number}].region {region!r} is not a declared region")
        followers = tuple(
            (f.get("region", ""), parse_address(f.get("address"), f"shards[{number}].followers"))
            for f in raw.get("followers", [])
        )
        shards.append(
            ShardConfig(number, parse_address(raw.get("leader"), f"shards[{number}].leader"), region, followers)
        )
    partitioner = cluster.get("partitioner", "hash")
    if partitioner not in ("hash", "prefix"):
        raise ConfigError("cluster.partitioner is 'hash' or 'prefix'")
    procedures = cluster.get("procedures", [])
    if not isinstance(procedures, list) or not all(
        isinstance(p, str) and ":" in p for p in procedures
    ):
        raise ConfigError("cluster.procedures is a list of 'module:function'")
    overrides = data.get("settings", {})
    try:
        settings = DEFAULT_SETTINGS.with_overrides(**overrides)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"[settings]: {exc}") from None
    wan = None
    raw_wan = data.get("wan")
    if raw_wan is not None:
        if not isinstance(raw_wan, dict):
            raise ConfigError("[wan] must be a table")
        try:
            wan = WanConfig(
                rtt_ms=float(raw_wan.get("rtt_ms", 50.0)),
                jitter_ms=float(raw_wan.get("jitter_ms", 1.0)),
                port_base=int(raw_wan.get("port_base", 9000)),
                control=parse_address(raw_wan.get("control", "127.0.0.1:8999"), "wan.control"),
            )
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"[wan]: {exc}") from None
        if wan.rtt_ms < 0 or wan.jitter_ms < 0:
            raise ConfigError("[wan]: rtt_ms and jitter_ms are not negative")
    try:
        rpc = MERIDIAN_RPC_SETTINGS.replace(**data.get("rpc", {}))
    except TypeError as exc:
        raise ConfigError(f"[rpc]: {exc}") from None
    cm = _parse_cm(data.get("cm", []), regions, shards)
    return ClusterConfig(
        name=str(cluster.get("name", "meridian")),
        path=path,
        run_dir=(base / cluster.get("run_dir", "runs")).resolve(),
        python_path=tuple((base / p).resolve() for p in cluster.get("python_path", [])),
        procedures=tuple(procedures),
        partitioner_kind=partitioner,
        shards=tuple(shards),
        regions=regions,
        settings=settings,
        client=dict(data.get("client", {})),
        replication_port_offset=int(cluster.get("replication_port_offset", 1000)),
        wan=wan,
        stream=dict(data.get("stream", {})),
        rpc=rpc,
        cm=cm,
    )


def _parse_cm(
    raw: object, regions: tuple[str, ...], shards: list[ShardConfig]
) -> tuple[tuple[str, tuple[str, int]], ...]:
    """The ``[[cm]]`` members: one per region at most, on addresses no replica uses."""
    if not isinstance(raw, list) or not all(isinstance(m, dict) for m in raw):
        raise ConfigError("[[cm]] entries are tables with a region and an address")
    members = []
    for number, entry in enumerate(raw):
        region = entry.get("region")
        if region not in regions:
            raise ConfigError(f"cm[{number}].region {region!r} is not a declared region")
        members.append((region, parse_address(entry.get("address"), f"cm[{number}].address")))
    if len({region for region, _ in members}) != len(members):
        raise ConfigError("[[cm]]: one member per region")
    used = {s.leader for s in shards} | {a for s in shards for _, a in s.followers}
    for _, address in members:
        if address in used:
            raise ConfigError(f"[[cm]]: {address[0]}:{address[1]} is also a replica's address")
    if members and not any(s.followers for s in shards):
        raise ConfigError("[[cm]]: failover needs followers (a shard with none cannot fail over)")
    return tuple(members)
