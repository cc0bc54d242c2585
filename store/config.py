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

import dataclasses
import os
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, TypeVar

from store.core.partition import Partitioner, PrefixPartitioner, WorkerPartitioner
from store.core.settings import DEFAULT_SETTINGS, DEFAULT_STREAM_SETTINGS, Settings
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


T = TypeVar("T")


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
class SecurityConfig:
    """``[security]``: mutual TLS on the replication links, and the cluster secret of the
    RPC core's sessions (docs/security.md). Paths are absolute (resolved against the
    cluster file's folder)."""

    tls: bool
    ca: Path | None
    cert_dir: Path | None
    secret_file: Path | None

    def identity_files(self, node: ReplicaNode) -> tuple[Path, Path]:
        """(key, certificate) of ``node``: ``<cert_dir>/<process name>.key`` and ``.pem``."""
        assert self.cert_dir is not None
        return self.cert_dir / f"{node.name}.key", self.cert_dir / f"{node.name}.pem"

    def secret(self) -> bytes | None:
        """The cluster secret (the file holds it in hex), or None without a secret_file."""
        if self.secret_file is None:
            return None
        try:
            text = self.secret_file.read_text().strip()
        except OSError as exc:
            raise ConfigError(f"[security] secret_file {self.secret_file}: {exc.strerror}") from None
        try:
            secret = bytes.fromhex(text)
        except ValueError:
            raise ConfigError(f"[security] secret_file {self.secret_file}: not hex") from None
        if not 16 <= len(secret) <= 64:
            raise ConfigError(
                f"[security] secret_file {self.secret_file}: the secret is 16 to 64 bytes "
                f"(32 to 128 hex digits), this one {len(secret)}"
            )
        return secret


@dataclass(frozen=True)
class ReplicaNode:
    """One server process: a shard's leader or one of its followers, or a configuration
    manager member (role "cm", shard -1)."""

    role: str  # "leader", "follower" or "cm"
    shard: int  # with workers: the unit, shard * workers + worker
    region: str
    rpc: tuple[str, int]
    workers: int = 1

    @property
    def label(self) -> str:
        """The shard as users see it: ``3``, or with workers ``3.1`` (shard 3, worker 1)."""
        if self.workers == 1:
            return str(self.shard)
        return f"{self.shard // self.workers}.{self.shard % self.workers}"

    @property
    def address(self) -> str:
        return f"{self.rpc[0]}:{self.rpc[1]}"

    @property
    def name(self) -> str:
        """The process's name: its log files', certificate's and status line's."""
        if self.role == "cm":
            return f"cm-{self.region}"
        if self.role == "leader":
            return f"shard-{self.label}"
        return f"shard-{self.label}-{self.region}"


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
    stream: dict[str, Any] = field(default_factory=dict)  # [stream]'s checked overrides
    rpc: RpcSettings = MERIDIAN_RPC_SETTINGS
    cm: tuple[tuple[str, tuple[str, int]], ...] = ()
    transport: str = "udp"  # the RPC core's: "udp", or "rdma" (store/rpc/rdma.py)
    sched_policy: str = "other"  # every server process's Linux scheduling policy (SCHED_POLICIES)
    security: SecurityConfig | None = None  # [security]; None: no TLS, no secret
    metrics_port_offset: int = 2000  # 0: no metrics endpoint
    data_dir: Path | None = None  # None: run_dir / "data"
    data_bytes_max: int = 256 << 20
    fsync: bool = True
    # [placement]: tables on every shard, and per table (field, splits) (PrefixPartitioner)
    replicated_tables: tuple[str, ...] = ()
    table_rules: dict[str, tuple[int, tuple[int, ...]]] = field(default_factory=dict)
    # Worker processes per shard leader (docs/design.md, "Workers"): ``shards`` then holds
    # one entry per worker (a unit, ``shard * workers + worker``), each with its own
    # addresses, and ``partitioner()`` maps keys to units.
    workers: int = 1

    def nodes(self) -> list[ReplicaNode]:
        """Every server process: the leaders, then the followers, shard by shard, then the
        configuration manager's members."""
        w = self.workers
        nodes = [ReplicaNode("leader", s.shard, s.region, s.leader, w) for s in self.shards]
        for shard in self.shards:
            nodes += [ReplicaNode("follower", shard.shard, r, a, w) for r, a in shard.followers]
        return nodes + self.cm_nodes()

    def cm_nodes(self) -> list[ReplicaNode]:
        return [ReplicaNode("cm", -1, region, address) for region, address in self.cm]

    def cm_addresses(self) -> list[str]:
        return [node.address for node in self.cm_nodes()]

    def shard_nodes(self, shard: int) -> list[ReplicaNode]:
        """Every replica of one shard: its first leader, then its followers."""
        config = self.shards[shard]
        w = self.workers
        return [ReplicaNode("leader", shard, config.region, config.leader, w)] + [
            ReplicaNode("follower", shard, region, address, w) for region, address in config.followers
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

    def data_root(self) -> Path:
        return self.data_dir or self.run_dir / "data"

    def process_data_dir(self, node: ReplicaNode) -> Path:
        """The directory of ``node``'s write-ahead logs (store.node.durable)."""
        return self.data_root() / node.name

    def metrics_listen(self, node: ReplicaNode) -> tuple[str, int] | None:
        """Where ``node`` serves its Prometheus metrics (None: not configured)."""
        if not self.metrics_port_offset:
            return None
        return node.rpc[0], node.rpc[1] + self.metrics_port_offset

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

    @property
    def shard_count(self) -> int:
        """Shards, not counting their workers (``len(shards)`` counts units)."""
        return len(self.shards) // self.workers

    def partitioner(self) -> Partitioner:
        base: Partitioner
        if self.partitioner_kind == "prefix" or self.replicated_tables or self.table_rules:
            base = PrefixPartitioner(
                self.shard_count, 1 if self.partitioner_kind == "prefix" else None,
                self.replicated_tables, self.table_rules,
            )
        else:
            base = Partitioner(self.shard_count)
        return base if self.workers == 1 else WorkerPartitioner(base, self.workers)

    def placement(self) -> dict[str, Any]:
        """How keys are placed, as ``meridian status`` shows it."""
        default = "field 1 mod shards" if self.partitioner_kind == "prefix" else "hash"
        return {
            "default": default,
            "replicated": list(self.replicated_tables),
            "tables": {
                table: {"field": rule_field, **({"splits": list(splits)} if splits else {})}
                for table, (rule_field, splits) in sorted(self.table_rules.items())
            },
        }

    def leader_addresses(self) -> list[str]:
        return [shard.leader_address for shard in self.shards]


# The sections of a cluster file that are not a settings object, with every key they take:
# key -> (type, default or None when required, meaning). docs/configuration.md is made from
# this table and from the settings objects' definitions (``store/config_reference.py``);
# ``from_dict`` refuses any key not named here.
STRUCTURE: dict[str, dict[str, tuple[str, Any, str]]] = {
    "cluster": {
        "name": ("string", "meridian", "the cluster's name (logs, status)"),
        "run_dir": ("path", "runs", "where server logs go; relative to the cluster file"),
        "python_path": ("list of paths", [], "added to the servers' module path (for procedures); relative to the cluster file"),
        "procedures": ("list of 'module:function'", [], "each function is called with the procedure registry at startup"),
        "partitioner": ("'hash' or 'prefix'", "hash", "key placement: CRC-32 of the key, or table/<n>/... on shard n mod S"),
        "replication_port_offset": ("integer", 1000, "a replica's gRPC replication port is its RPC port plus this"),
        "metrics_port_offset": ("integer", 2000, "each server serves Prometheus metrics over HTTP at its RPC host, port RPC port plus this, path /metrics; 0: no metrics endpoint"),
        "data_dir": ("path", "<run_dir>/data", "where each server keeps its write-ahead logs, in a directory of its own (<data_dir>/<process name>); relative to the cluster file"),
        "data_bytes_max": ("integer (bytes)", 256 << 20, "a bound on each process's data directory (its write-ahead log and, for a follower, its snapshot): a log is rewritten as its acceptor's checkpoint (its promise and the values it still keeps, log_retained_slots of [stream]) before the directory would pass it; a bound below what the acceptor keeps cannot be held, and the status says so; 0: never rewrite"),
        "fsync": ("true / false", True, "sync every acceptor's promises and votes to disk before the messages that follow them; false is for benchmarks only: a power cut in a majority of regions can then lose committed transactions"),
        "transport": ("'udp' or 'rdma'", "udp", "the RPC core's transport between servers and clients; 'rdma' needs an RDMA device and is refused at startup where it cannot run, saying why"),
        "workers": ("integer", 1, "worker processes per shard leader (and per follower), each holding a slice of the shard's keys with its own Paxos stream; the workers of a shard must run on one machine (they share its counter in a file under run_dir)"),
        "sched_policy": ("'other' or 'idle'", "other", "the Linux scheduling policy of every server process: 'other' leaves the one it was started with (Linux's default); 'idle' (SCHED_IDLE) is for a machine given to the cluster whose processes outnumber its cores: Linux leaves a runnable process queued behind another rather than move it to an idle core if it ran in the last 0.5 ms (it counts it cache-hot), and exempts SCHED_IDLE processes from that rule; any process of the default policy on the machine then runs before the cluster's, so not for a machine shared with other work (docs/performance.md)"),
        "worker_port_stride": ("integer", 10, "with workers: worker w of a shard listens on the shard's addresses' ports plus w times this"),
    },
    "regions": {
        "name": ("string", None, "a region (datacenter) name"),
    },
    "shards": {
        "leader": ("'host:port'", None, "the RPC address of the shard's first leader"),
        "region": ("region name", "the first region", "the leader's region"),
        "followers": ("list of {region, address}", [], "one follower per other region"),
    },
    "followers": {
        "region": ("region name", None, "the follower's region"),
        "address": ("'host:port'", None, "the follower's RPC address"),
    },
    "cm": {
        "region": ("region name", None, "the member's region (one member per region)"),
        "address": ("'host:port'", None, "the member's RPC address"),
    },
    "security": {
        "tls": ("true / false", False, "mutual TLS on every replication (gRPC) link: each process shows its certificate and checks its peer's against the CA"),
        "ca": ("path", None, "the cluster's CA certificate (PEM); its key beside it, as .key, for meridian certs; relative to the cluster file"),
        "cert_dir": ("path", None, "each process's <name>.pem and <name>.key (names: shard-<n>, shard-<n>-<region>, cm-<region>); relative to the cluster file"),
        "secret_file": ("path", None, "the cluster secret (hex, 16 to 64 bytes): RPC sessions (servers and clients alike) are made only between endpoints that have it; relative to the cluster file"),
    },
    "placement": {
        "replicated": ("list of table names", [], "tables kept whole on every shard: a transaction reads them on its coordinator's shard, and every write to them is certified and installed by all shards (for read-mostly tables, like TPC-C's ITEM)"),
        "tables": ("table of {field, splits}", {}, "per table, the key element that chooses the shard: 'stock = { field = 1 }' places ('stock', w, ...) and 'stock/<w>/...' on shard w mod shards; with 'splits = [10, 20]' (ascending), values below 10 on shard 0, below 20 on shard 1, the rest on shard 2 (range placement); keys without an integer there are hashed"),
    },
    "wan": {
        "rtt_ms": ("float", 50.0, "emulated round trip between regions, in milliseconds"),
        "jitter_ms": ("float", 1.0, "uniform jitter added to each direction, in milliseconds"),
        "port_base": ("integer", 9000, "first port of the wan-proxy's links"),
        "control": ("'host:port'", "127.0.0.1:8999", "the wan-proxy's control address"),
    },
}

# The settings objects a cluster file's sections override: section -> what is documented.
SETTINGS_SECTIONS = ("settings", "stream", "rpc", "client")
# [client] keys beyond ClientSettings' fields.
CLIENT_EXTRA = {"region": ("region name", None, "the region whose followers snapshot reads go to by default")}


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
    except IsADirectoryError:
        raise ConfigError(f"{path} is a directory, not a cluster file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read the cluster file {path}: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    return from_dict(data, path)


def _table(value: object, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ConfigError(f"{what} must be a table")
    return value


# Keys of earlier versions, and what took their place.
RENAMED = {
    "log_bytes_max": "data_bytes_max (a bound on the whole data directory, snapshot included)",
}


def _known_keys(table: dict[str, Any], section: str, what: str, extra: tuple[str, ...] = ()) -> None:
    known = set(STRUCTURE[section]) | set(extra)
    for key in table:
        if key in RENAMED and key not in known:
            raise ConfigError(f"{what}: {key!r} is now {RENAMED[key]}")
        if key not in known:
            raise ConfigError(f"{what}: unknown key {key!r}; known: {', '.join(sorted(known))}")


def _string(value: object, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{what}: expected a non-empty string, got {value!r}")
    return value


def _integer(value: object, what: str) -> int:
    if type(value) is not int or value < 0:
        raise ConfigError(f"{what}: expected a non-negative integer, got {value!r}")
    return value


def _boolean(value: object, what: str) -> bool:
    if type(value) is not bool:
        raise ConfigError(f"{what}: expected true or false, got {value!r}")
    return value


def _number(value: object, what: str) -> float:
    if type(value) not in (int, float) or value < 0:  # type: ignore[operator]
        raise ConfigError(f"{what}: expected a non-negative number, got {value!r}")
    return float(value)  # type: ignore[arg-type]


def settings_section(section: str, base: T, raw: object) -> T:
    """``base`` (a settings dataclass) with the overrides of ``[section]``, each checked:
    the key must be a field, the value of the field's type (an int where a float is
    expected is taken) and not negative; the object's own checks must pass."""
    table = _table(raw, f"[{section}]")
    known = {f.name for f in fields(base)}  # type: ignore[arg-type]
    values: dict[str, Any] = {}
    for key, value in table.items():
        if key not in known:
            raise ConfigError(
                f"[{section}] {key}: unknown setting; known: {', '.join(sorted(known))}"
            )
        default = getattr(base, key)
        expected = type(default)
        if expected is float and type(value) is int:
            value = float(value)
        if type(value) is not expected:
            raise ConfigError(
                f"[{section}] {key}: expected {expected.__name__} (like {default!r}), "
                f"got {value!r}"
            )
        if isinstance(value, int | float) and not isinstance(value, bool) and value < 0:
            raise ConfigError(f"[{section}] {key}: must not be negative, got {value!r}")
        values[key] = value
    try:
        return dataclasses.replace(base, **values)  # type: ignore[type-var]
    except (TypeError, ValueError, AssertionError) as exc:
        raise ConfigError(f"[{section}]: {exc}") from None


def from_dict(data: dict[str, Any], path: Path | None = None) -> ClusterConfig:
    from store.client.protocol import ClientSettings  # lazily: the SDK imports this module

    base = path.parent if path is not None else Path.cwd()
    known_sections = {
        "cluster", "regions", "shards", "cm", "wan", "security", "placement", *SETTINGS_SECTIONS,
    }
    for section in data:
        if section not in known_sections:
            raise ConfigError(
                f"unknown section [{section}]; known: {', '.join(sorted(known_sections))}"
            )
    cluster = _table(data.get("cluster", {}), "[cluster]")
    _known_keys(cluster, "cluster", "[cluster]")
    raw_regions = data.get("regions", [{"name": "local"}])
    if not isinstance(raw_regions, list) or not raw_regions:
        raise ConfigError("[[regions]] need a name each")
    regions_list = []
    for number, raw in enumerate(raw_regions):
        raw = _table(raw, f"regions[{number}]")
        _known_keys(raw, "regions", f"regions[{number}]")
        regions_list.append(_string(raw.get("name"), f"regions[{number}].name"))
    regions = tuple(regions_list)
    if len(set(regions)) != len(regions):
        raise ConfigError("[[regions]]: each name once")
    raw_shards = data.get("shards")
    if not isinstance(raw_shards, list) or not raw_shards:
        raise ConfigError("at least one [[shards]] entry is needed")
    shards = []
    for number, raw in enumerate(raw_shards):
        raw = _table(raw, f"shards[{number}]")
        _known_keys(raw, "shards", f"shards[{number}]")
        region = raw.get("region", regions[0])
        if region not in regions:
            raise ConfigError(f"shards[{number}].region {region!r} is not a declared region")
        raw_followers = raw.get("followers", [])
        if not isinstance(raw_followers, list):
            raise ConfigError(f"shards[{number}].followers must be a list of tables")
        followers = []
        for index, follower in enumerate(raw_followers):
            what = f"shards[{number}].followers[{index}]"
            follower = _table(follower, what)
            _known_keys(follower, "followers", what)
            if follower.get("region") not in regions:
                raise ConfigError(f"{what}.region {follower.get('region')!r} is not a declared region")
            followers.append((follower["region"], parse_address(follower.get("address"), what)))
        shards.append(
            ShardConfig(
                number, parse_address(raw.get("leader"), f"shards[{number}].leader"), region,
                tuple(followers),
            )
        )
    transport = cluster.get("transport", "udp")
    if transport not in ("udp", "rdma"):
        raise ConfigError(f"cluster.transport is 'udp' or 'rdma', got {transport!r}")
    sched_policy = cluster.get("sched_policy", "other")
    if sched_policy not in SCHED_POLICIES:
        raise ConfigError(f"cluster.sched_policy is 'other' or 'idle', got {sched_policy!r}")
    partitioner = cluster.get("partitioner", "hash")
    if partitioner not in ("hash", "prefix"):
        raise ConfigError("cluster.partitioner is 'hash' or 'prefix'")
    replicated_tables, table_rules = _parse_placement(data.get("placement"), len(shards))
    workers = _integer(cluster.get("workers", 1), "cluster.workers")
    stride = _integer(cluster.get("worker_port_stride", 10), "cluster.worker_port_stride")
    if not 1 <= workers <= WORKERS_MAX:
        raise ConfigError(f"cluster.workers must be in [1, {WORKERS_MAX}], got {workers}")
    if workers > 1:
        if stride < 1:
            raise ConfigError(f"cluster.worker_port_stride must be at least 1, got {stride}")
        shards = _worker_units(shards, workers, stride)
    procedures = cluster.get("procedures", [])
    if not isinstance(procedures, list) or not all(
        isinstance(p, str) and ":" in p for p in procedures
    ):
        raise ConfigError("cluster.procedures is a list of 'module:function'")
    python_path = cluster.get("python_path", [])
    if not isinstance(python_path, list) or not all(isinstance(p, str) for p in python_path):
        raise ConfigError("cluster.python_path is a list of paths")
    settings = settings_section("settings", DEFAULT_SETTINGS, data.get("settings", {}))
    raw_stream = _table(data.get("stream", {}), "[stream]")
    stream_settings = settings_section("stream", DEFAULT_STREAM_SETTINGS, raw_stream)
    stream = {name: getattr(stream_settings, name) for name in raw_stream}
    rpc = settings_section("rpc", MERIDIAN_RPC_SETTINGS, data.get("rpc", {}))
    raw_client = dict(_table(data.get("client", {}), "[client]"))
    client_region = raw_client.pop("region", None)
    if client_region is not None and client_region not in regions:
        raise ConfigError(f"[client] region {client_region!r} is not a declared region")
    client_settings = settings_section("client", ClientSettings(), raw_client)
    client = {
        f.name: getattr(client_settings, f.name) for f in fields(client_settings)
        if f.name in raw_client
    }
    if client_region is not None:
        client["region"] = client_region
    wan = None
    raw_wan = data.get("wan")
    if raw_wan is not None:
        raw_wan = _table(raw_wan, "[wan]")
        _known_keys(raw_wan, "wan", "[wan]")
        wan = WanConfig(
            rtt_ms=_number(raw_wan.get("rtt_ms", 50.0), "wan.rtt_ms"),
            jitter_ms=_number(raw_wan.get("jitter_ms", 1.0), "wan.jitter_ms"),
            port_base=_integer(raw_wan.get("port_base", 9000), "wan.port_base"),
            control=parse_address(raw_wan.get("control", "127.0.0.1:8999"), "wan.control"),
        )
    cm = _parse_cm(data.get("cm", []), regions, shards)
    taken: dict[tuple[str, int], str] = {}
    for what, address in [
        *((f"shards[{s.shard}] leader", s.leader) for s in shards),
        *((f"shards[{s.shard}] follower", a) for s in shards for _, a in s.followers),
        *(("a cm member", a) for _, a in cm),
    ]:
        other = taken.setdefault(address, what)
        if other != what:
            raise ConfigError(
                f"{address[0]}:{address[1]} is both {other} and {what}"
                + (" (with workers: move the shards' ports apart, or change "
                   "cluster.worker_port_stride)" if workers > 1 else "")
            )
    security = _parse_security(data.get("security"), base)
    replication_offset = _integer(
        cluster.get("replication_port_offset", 1000), "cluster.replication_port_offset"
    )
    metrics_offset = _integer(cluster.get("metrics_port_offset", 2000), "cluster.metrics_port_offset")
    addresses = [s.leader for s in shards] + [a for s in shards for _, a in s.followers]
    for host, port in addresses + [a for _, a in cm]:
        if port + max(replication_offset, metrics_offset) > 65535:
            raise ConfigError(
                f"{host}:{port}: its replication or metrics port (RPC port + "
                f"replication_port_offset / metrics_port_offset) would pass 65535"
            )
    config = ClusterConfig(
        name=_string(cluster.get("name", "meridian"), "cluster.name"),
        path=path,
        run_dir=(base / _string(cluster.get("run_dir", "runs"), "cluster.run_dir")).resolve(),
        python_path=tuple((base / p).resolve() for p in python_path),
        procedures=tuple(procedures),
        partitioner_kind=partitioner,
        shards=tuple(shards),
        regions=regions,
        settings=settings,
        client=client,
        replication_port_offset=replication_offset,
        wan=wan,
        stream=stream,
        rpc=rpc,
        cm=cm,
        transport=transport,
        sched_policy=sched_policy,
        security=security,
        metrics_port_offset=metrics_offset,
        data_dir=(
            (base / _string(cluster["data_dir"], "cluster.data_dir")).resolve()
            if "data_dir" in cluster else None
        ),
        fsync=_boolean(cluster.get("fsync", True), "cluster.fsync"),
        data_bytes_max=_integer(cluster.get("data_bytes_max", 256 << 20), "cluster.data_bytes_max"),
        replicated_tables=replicated_tables,
        table_rules=table_rules,
        workers=workers,
    )
    _check_listeners(config)
    return config


WORKERS_MAX = 64

# cluster.sched_policy -> the os module's policy (Linux's SCHED_OTHER and SCHED_IDLE).
SCHED_POLICIES: dict[str, int] = {"other": getattr(os, "SCHED_OTHER", 0), "idle": getattr(os, "SCHED_IDLE", 5)}


def _worker_units(shards: list[ShardConfig], workers: int, stride: int) -> list[ShardConfig]:
    """Each shard's ``workers`` units: worker ``w`` at the shard's ports plus ``w * stride``."""
    units = []
    for config in shards:
        for w in range(workers):
            step = w * stride

            def moved(address: tuple[str, int], step: int = step, w: int = w) -> tuple[str, int]:
                if address[1] + step > 65535:
                    raise ConfigError(
                        f"{address[0]}:{address[1]}: worker {w}'s port (+ {step}) would pass 65535"
                    )
                return address[0], address[1] + step

            units.append(ShardConfig(
                config.shard * workers + w, moved(config.leader), config.region,
                tuple((region, moved(address)) for region, address in config.followers),
            ))
    return units


def _check_listeners(config: ClusterConfig) -> None:
    """Every TCP port the cluster's processes listen on (replication, metrics, the wan-proxy's
    links and control) belongs to one of them; two on the same address would leave one
    process unable to start."""
    owners: dict[tuple[str, int], str] = {}

    def claim(address: tuple[str, int], what: str) -> None:
        other = owners.setdefault(address, what)
        if other != what:
            raise ConfigError(
                f"{address[0]}:{address[1]} is both {other} and {what}; move one of them "
                f"(ports derive from cluster.replication_port_offset, "
                f"cluster.metrics_port_offset and wan.port_base)"
            )

    for node in config.nodes():
        claim(config.replication_listen(node), f"{node.name}'s replication port")
        metrics = config.metrics_listen(node)
        if metrics is not None:
            claim(metrics, f"{node.name}'s metrics port")
    if config.wan is not None:
        claim(config.wan.control, "the wan-proxy's control port")
        for name, listen, *_ in config.wan_links():
            claim(listen, f"the wan-proxy's link {name}")


def _parse_placement(
    raw: object, shard_count: int,
) -> tuple[tuple[str, ...], dict[str, tuple[int, tuple[int, ...]]]]:
    """``[placement]``: the replicated tables, and each placed table's (field, splits)."""
    if raw is None:
        return (), {}
    table = _table(raw, "[placement]")
    _known_keys(table, "placement", "[placement]")
    replicated = table.get("replicated", [])
    if not isinstance(replicated, list) or not all(isinstance(t, str) and t for t in replicated):
        raise ConfigError("[placement] replicated: expected a list of table names")
    rules: dict[str, tuple[int, tuple[int, ...]]] = {}
    for name, rule in _table(table.get("tables", {}), "[placement] tables").items():
        what = f"[placement] tables.{name}"
        rule = _table(rule, what)
        unknown = set(rule) - {"field", "splits"}
        if unknown:
            raise ConfigError(f"{what}: unknown key {sorted(unknown)[0]!r}; known: field, splits")
        rule_field = rule.get("field", 1)
        if type(rule_field) is not int or rule_field < 1:
            raise ConfigError(f"{what}.field: expected an element index of 1 or more (0 is the table), got {rule_field!r}")
        splits = rule.get("splits", [])
        if not isinstance(splits, list) or not all(type(v) is int for v in splits) or splits != sorted(set(splits)):
            raise ConfigError(f"{what}.splits: expected ascending distinct integers, got {splits!r}")
        if len(splits) > shard_count - 1:
            raise ConfigError(f"{what}.splits: {len(splits)} splits make more ranges than the {shard_count} shards")
        if name in replicated:
            raise ConfigError(f"{what}: {name!r} is replicated on every shard; it has no placement")
        rules[name] = (rule_field, tuple(splits))
    return tuple(replicated), rules


def _parse_security(raw: object, base: Path) -> SecurityConfig | None:
    if raw is None:
        return None
    table = _table(raw, "[security]")
    _known_keys(table, "security", "[security]")
    tls = table.get("tls", False)
    if type(tls) is not bool:
        raise ConfigError(f"[security] tls: expected true or false, got {tls!r}")

    def path(key: str) -> Path | None:
        value = table.get(key)
        return None if value is None else (base / _string(value, f"security.{key}")).resolve()

    security = SecurityConfig(tls, path("ca"), path("cert_dir"), path("secret_file"))
    if tls and (security.ca is None or security.cert_dir is None):
        raise ConfigError("[security] tls = true needs ca and cert_dir")
    return security


def _parse_cm(
    raw: object, regions: tuple[str, ...], shards: list[ShardConfig]
) -> tuple[tuple[str, tuple[str, int]], ...]:
    """The ``[[cm]]`` members: one per region at most, on addresses no replica uses."""
    if not isinstance(raw, list) or not all(isinstance(m, dict) for m in raw):
        raise ConfigError("[[cm]] entries are tables with a region and an address")
    members = []
    for number, entry in enumerate(raw):
        _known_keys(entry, "cm", f"cm[{number}]")
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
