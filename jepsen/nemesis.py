"""The nemesis: which faults a Jepsen run injects, when, and how.

A run's faults follow a schedule drawn from its seed before the run starts (the schedule is
part of ``results.edn``, so a run can be read and repeated). Faults never overlap: each one
starts, lasts ``fault_s`` and is healed, then the cluster has ``quiet_s`` to recover before
the next. The kinds, in the order they take turns (a kill between every two other faults, as
leader kills are what this store's recovery is for):

- ``kill``: SIGKILL of a shard's current leader, a random shard replica, or a minority (every
  shard replica of one region); at the end of the fault the killed processes start again
  (``serve --rejoin``: they copy a live replica's state and rejoin as followers);
- ``restart``: SIGKILL of a leader or a random replica and an immediate start again;
- ``pause``: SIGSTOP of a leader or a random replica, SIGCONT at the end;
- ``partition``: one region isolated from the others (the leaders' region or a random one),
  or a bridge (one pair of regions cut, the third still talks to both: with three regions
  this is also the "majorities ring"); healed at the end. Clients keep reaching every
  region, as in Jepsen, where partitions are between the database's nodes.

Kills and pauses take at most a minority of each shard: a replica is a target only while
the other replicas of its shard vote (a restarted replica votes once it has copied a live
replica's state and caught up; ``meridian status`` shows ``voting``). Taking a second
replica of a shard before the first is back would leave the shard without a majority, which
no protocol survives (and which the issue's faults do not ask for).

Configuration-manager members are never killed or paused here: a CM member cannot rejoin
yet (docs/recovery.md), and losing one of three for good would leave the next kill without
a majority. They are cut off by partitions like every process of their region.
"""

from __future__ import annotations

import os
import random
import signal
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from jepsen.hosts import Hosts
from store.config import ClusterConfig
from store.node.server import log_name
from store.node.up import ProcessCluster

__all__ = ["KINDS", "Nemesis", "Planned", "plan_schedule"]

KINDS = ("kill", "pause", "partition", "restart")

# What each kind aims at, in turn.
_TARGETS = {
    "kill": ("leader", "leader", "random", "leader", "minority"),
    "restart": ("leader", "random"),
    "pause": ("leader", "random"),
    "partition": ("isolate-leaders", "bridge", "isolate"),
}


@dataclass(frozen=True)
class Planned:
    """One fault of the schedule: ``kind`` aimed at ``aim`` from ``at_s`` for ``for_s``."""

    at_s: float
    kind: str
    aim: str
    for_s: float

    def edn(self) -> dict[str, object]:
        return {"at-s": self.at_s, "kind": self.kind, "aim": self.aim, "for-s": self.for_s}


def plan_schedule(
    kinds: Sequence[str],
    time_limit_s: float,
    rng: random.Random,
    fault_s: float,
    quiet_s: float,
    first_at_s: float,
) -> list[Planned]:
    """Faults from ``first_at_s`` until the time limit, one at a time (see the module doc)."""
    others = [kind for kind in KINDS if kind in kinds and kind != "kill"]
    turns: list[str] = []
    for other in others or [None]:  # type: ignore[list-item]
        if "kill" in kinds:
            turns.append("kill")
        if other is not None:
            turns.append(other)
    if not turns:
        return []
    aims = {kind: 0 for kind in KINDS}
    plan = []
    at = first_at_s
    turn = 0
    while at + fault_s <= time_limit_s:
        kind = turns[turn % len(turns)]
        choices = _TARGETS[kind]
        aim = choices[aims[kind] % len(choices)]
        aims[kind] += 1
        duration = 0.0 if kind == "restart" else fault_s * rng.uniform(0.75, 1.25)
        plan.append(Planned(round(at, 3), kind, aim, round(duration, 3)))
        at += max(duration, fault_s) + quiet_s
        turn += 1
    return plan


class Nemesis:
    """Carries out faults on a running cluster. ``start`` returns a description of what it
    did (the history's nemesis value) and remembers how to undo it; ``stop`` undoes it."""

    def __init__(self, cluster: ProcessCluster, hosts: Hosts, rng: random.Random) -> None:
        self.cluster = cluster
        self.hosts = hosts
        self.rng = rng
        self.config: ClusterConfig = cluster.config
        self.killed: list[str] = []
        self.paused: list[str] = []
        self.counts: dict[str, int] = {}
        self.leader_kills = 0
        self._by_address = {node.address: log_name(node) for node in self.config.nodes()}
        self._shard_of = {
            log_name(node): node.shard for node in self.config.nodes() if node.role != "cm"
        }

    def _replicas(self) -> list[str]:
        return [log_name(node) for node in self.config.nodes() if node.role != "cm"]

    def _pick(self, aim: str, leaders: Sequence[str], down: Collection[str]) -> list[str]:
        """Process names for an aim; ``leaders`` are the shards' leader addresses now,
        ``down`` the replicas that do not vote now (rejoining, or not answering). A replica
        is a target only if no other replica of its shard is down: a fault takes at most a
        minority of a shard (one of three) at a time."""

        def minority(name: str) -> bool:
            shard = self._shard_of[name]
            return not any(o in down for o, s in self._shard_of.items() if s == shard and o != name)

        alive = [
            n for n in self._replicas()
            if n not in self.killed and n not in self.paused and minority(n)
        ]
        if aim == "leader":
            names = [self._by_address[a] for a in leaders if self._by_address.get(a) in alive]
            return [self.rng.choice(names)] if names else []
        if aim == "random":
            return [self.rng.choice(alive)] if alive else []
        if aim == "minority":
            region = self.rng.choice(list(self.config.regions))
            return [
                log_name(node) for node in self.config.nodes()
                if node.role != "cm" and node.region == region and log_name(node) in alive
            ]
        raise ValueError(f"no such aim: {aim}")

    def start(self, planned: Planned, leaders: Sequence[str], down: Collection[str] = ()) -> str:
        if planned.kind in ("kill", "restart", "pause") and not self._pick(planned.aim, leaders, down):
            return f"no {planned.kind}: every shard has a replica that does not vote ({sorted(down)})"
        self.counts[planned.kind] = self.counts.get(planned.kind, 0) + 1
        if planned.kind in ("kill", "restart"):
            names = self._pick(planned.aim, leaders, down)
            leader_names = {self._by_address.get(a) for a in leaders}
            for name in names:
                os.kill(self.cluster.pid_of(name), signal.SIGKILL)
                self.cluster.children[self.cluster.names.index(name)].wait()
                self.cluster.reported.add(name)  # an expected death: not the supervisor's news
                self.leader_kills += name in leader_names
            self.killed = names
            what = ", ".join(f"{n} (leader)" if n in leader_names else n for n in names)
            if planned.kind == "restart":
                self._start_killed()
                return f"killed and started again {what}"
            return f"killed {what}"
        if planned.kind == "pause":
            names = self._pick(planned.aim, leaders, down)
            for name in names:
                os.kill(self.cluster.pid_of(name), signal.SIGSTOP)
            self.paused = names
            return f"paused {', '.join(names)}"
        if planned.kind == "partition":
            regions = list(self.config.regions)
            if planned.aim == "bridge":
                a, b = self.rng.sample(regions, 2)
                self.hosts.cut(a, b)
                bridge = next(r for r in regions if r not in (a, b))
                return f"cut {a} from {b}; {bridge} bridges them"
            if planned.aim == "isolate-leaders":
                region_of = {n.address: n.region for n in self.config.nodes()}
                counted = [region_of[a] for a in leaders if a in region_of]
                region = max(regions, key=counted.count) if counted else self.rng.choice(regions)
            else:
                region = self.rng.choice(regions)
            self.hosts.isolate(region)
            return f"isolated {region}"
        raise ValueError(f"no such fault: {planned.kind}")

    def _start_killed(self) -> None:
        for name in self.killed:
            self.cluster.respawn(name)
        self.killed = []

    def stop(self) -> str:
        """Heals whatever is active; returns what it did ('' when nothing was)."""
        done = []
        if self.killed:
            done.append(f"started {', '.join(self.killed)} again")
            self._start_killed()
        if self.paused:
            for name in self.paused:
                os.kill(self.cluster.pid_of(name), signal.SIGCONT)
            done.append(f"resumed {', '.join(self.paused)}")
            self.paused = []
        if self.hosts.partitions and self.hosts.cuts():
            self.hosts.heal()
            done.append("healed the network")
        return "; ".join(done)
