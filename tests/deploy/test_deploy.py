"""deploy/ (docs/deploy.md): the Kubernetes manifests, the systemd units and the container
image of a three-region cluster, checked without a cluster, a systemd or a container engine.

The manifests must be valid Kubernetes objects (kubernetes-validate's schemas, strict); the
servers' command lines must be ``meridian serve`` commands of the role their StatefulSet or
unit says, as Meridian's own parser reads them; the cluster file must name exactly the
processes the StatefulSets run, at their pods' DNS names and ports; each pod must mount its
own certificate; every start after a process's first must rejoin (``--rejoin``), a
configuration manager member's as a replica's. The start scripts are run (in a temporary
directory, with a stand-in ``meridian``), not just read.
"""

from __future__ import annotations

import argparse
import base64
import configparser
import json
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from store.cli import build_parser
from tests.conftest import REPO

DEPLOY = REPO / "deploy"
KUBERNETES = DEPLOY / "kubernetes"
SYSTEMD = DEPLOY / "systemd"
CONTAINERFILE = DEPLOY / "container" / "Containerfile"

NAMESPACE = "meridian"
# The oldest Kubernetes the manifests are for (the pod-index label), and the newest schema
# kubernetes-validate ships.
KUBERNETES_VERSIONS = ["1.28", kubernetes_validate.latest_version()]
# A StatefulSet's name says the region and the role of the processes its pods run.
STATEFULSET_NAME = re.compile(r"meridian-(?P<region>[a-z]+)-(?P<role>leader|follower|cm)")
POD_INDEX_LABEL = "apps.kubernetes.io/pod-index"
POD_INDEX_FIELD = f"metadata.labels['{POD_INDEX_LABEL}']"
REGION_LABEL = "meridian/region"

Process = tuple[str, int, str]  # (role, shard or -1 for a CM member, region)


# --- reading the manifests ---------------------------------------------------------------


def _load_documents() -> list[tuple[str, dict[str, Any]]]:
    documents = []
    for path in sorted([*KUBERNETES.glob("*.yaml"), *KUBERNETES.glob("*.yml")]):
        for document in yaml.safe_load_all(path.read_text()):
            if document:
                documents.append((path.name, document))
    return documents


DOCUMENTS = _load_documents()


def of_kind(kind: str) -> list[dict[str, Any]]:
    return [document for _, document in DOCUMENTS if document["kind"] == kind]


def by_name(kind: str) -> dict[str, dict[str, Any]]:
    return {document["metadata"]["name"]: document for document in of_kind(kind)}


STATEFULSETS = of_kind("StatefulSet")


def statefulset_id(statefulset: dict[str, Any]) -> str:
    return str(statefulset["metadata"]["name"])


def container(statefulset: dict[str, Any]) -> dict[str, Any]:
    containers = statefulset["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1, f"{statefulset_id(statefulset)}: one container per pod"
    return dict(containers[0])


def name_parts(statefulset: dict[str, Any]) -> tuple[str, str]:
    """(region, role) from the StatefulSet's name."""
    match = STATEFULSET_NAME.fullmatch(statefulset_id(statefulset))
    assert match, f"{statefulset_id(statefulset)}: not meridian-<region>-<leader|follower|cm>"
    return match["region"], match["role"]


def parse_serve(arguments: list[str], where: str) -> argparse.Namespace:
    """``arguments`` as ``meridian`` reads them; a parser error fails the test."""
    try:
        return build_parser().parse_args(arguments)
    except SystemExit:
        pytest.fail(f"{where}: meridian does not accept {shlex.join(arguments)}")


def pod_arguments(statefulset: dict[str, Any], ordinal: int) -> list[str]:
    """The container's args in the pod of ``ordinal``: Kubernetes expands $(POD_INDEX)."""
    arguments = [
        str(a).replace("$(POD_INDEX)", str(ordinal)) for a in container(statefulset)["args"]
    ]
    unexpanded = [a for a in arguments if "$(" in a]
    assert not unexpanded, f"{statefulset_id(statefulset)}: unexpanded {unexpanded}"
    return arguments


def pod_serve(statefulset: dict[str, Any], ordinal: int) -> argparse.Namespace:
    name = f"{statefulset_id(statefulset)}-{ordinal}"
    return parse_serve(pod_arguments(statefulset, ordinal), name)


def pod_process(statefulset: dict[str, Any], ordinal: int) -> Process:
    region, _ = name_parts(statefulset)
    serve = pod_serve(statefulset, ordinal)
    shard = -1 if serve.role == "cm" else serve.shard
    return serve.role, shard, serve.region or region


def process_name(process: Process) -> str:
    """A process's name (its log, its certificate): shard-<n>, shard-<n>-<region>, cm-<region>."""
    role, shard, region = process
    if role == "cm":
        return f"cm-{region}"
    return f"shard-{shard}" if role == "leader" else f"shard-{shard}-{region}"


def container_ports(statefulset: dict[str, Any]) -> dict[str, tuple[int, str]]:
    ports = container(statefulset).get("ports", [])
    return {p["name"]: (p["containerPort"], p.get("protocol", "TCP")) for p in ports}


def object_keys(kind: str, name: str) -> list[str]:
    objects = by_name("ConfigMap" if kind == "configMap" else "Secret")
    assert name in objects, f"no {kind} {name!r} in deploy/kubernetes"
    return sorted({**objects[name].get("data", {}), **objects[name].get("stringData", {})})


def mounted_files(statefulset: dict[str, Any]) -> dict[str, tuple[str, str, str]]:
    """Every file the container sees from a ConfigMap or a Secret: its path in the pod ->
    (configMap or secret, the object's name, the key)."""
    pod = statefulset["spec"]["template"]["spec"]
    volumes = {volume["name"]: volume for volume in pod.get("volumes", [])}
    files = {}
    for mount in container(statefulset).get("volumeMounts", []):
        volume = volumes.get(mount["name"])
        if volume is None:
            continue
        sources = volume["projected"]["sources"] if "projected" in volume else [volume]
        in_volume = {}
        for source in sources:
            for kind in ("configMap", "secret"):
                if kind not in source:
                    continue
                reference = source[kind]
                name = reference.get("name") or reference.get("secretName")
                items = reference.get("items") or [
                    {"key": key, "path": key} for key in object_keys(kind, name)
                ]
                for item in items:
                    in_volume[item["path"]] = (kind, name, item["key"])
        for path, what in in_volume.items():
            if "subPath" in mount:
                if path == mount["subPath"]:
                    files[mount["mountPath"]] = what
            else:
                files[f"{mount['mountPath'].rstrip('/')}/{path}"] = what
    return files


def writable_mounts(statefulset: dict[str, Any], claims_only: bool = False) -> list[str]:
    """Mount paths of the container's writable volumes: the volumeClaimTemplates' (they
    outlive the pod), and emptyDirs unless ``claims_only``."""
    claims = {t["metadata"]["name"] for t in statefulset["spec"].get("volumeClaimTemplates", [])}
    pod = statefulset["spec"]["template"]["spec"]
    empty = {v["name"] for v in pod.get("volumes", []) if "emptyDir" in v}
    allowed = claims if claims_only else claims | empty
    return [
        mount["mountPath"] for mount in container(statefulset).get("volumeMounts", [])
        if mount["name"] in allowed and not mount.get("readOnly", False)
    ]


def pod_labels(statefulset: dict[str, Any], ordinal: int) -> dict[str, str]:
    """The labels Kubernetes gives the pod of ``ordinal``: the template's, and its own."""
    return {
        **statefulset["spec"]["template"]["metadata"]["labels"],
        POD_INDEX_LABEL: str(ordinal),
        "statefulset.kubernetes.io/pod-name": f"{statefulset_id(statefulset)}-{ordinal}",
    }


def selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for expression in selector.get("matchExpressions", []):
        key, operator = expression["key"], expression["operator"]
        values = expression.get("values", [])
        if not {
            "In": key in labels and labels[key] in values,
            "NotIn": key not in labels or labels[key] not in values,
            "Exists": key in labels,
            "DoesNotExist": key not in labels,
        }[operator]:
            return False
    return True


def pod_dns_name(statefulset: dict[str, Any], ordinal: int) -> str:
    service = statefulset["spec"]["serviceName"]
    namespace = statefulset["metadata"]["namespace"]
    return f"{statefulset_id(statefulset)}-{ordinal}.{service}.{namespace}.svc.cluster.local"


# --- reading cluster files ---------------------------------------------------------------


def kubernetes_cluster_text() -> str:
    configmaps = by_name("ConfigMap")
    assert "meridian-cluster" in configmaps, "no ConfigMap meridian-cluster"
    return str(configmaps["meridian-cluster"]["data"]["cluster.toml"])


CLUSTER_FILES = {
    "kubernetes": kubernetes_cluster_text,
    "systemd": (SYSTEMD / "cluster.toml").read_text,
}


def cluster_processes(data: dict[str, Any]) -> dict[str, Process]:
    """Every server process a cluster file names: its address -> (role, shard, region)."""
    regions = [region["name"] for region in data["regions"]]
    processes: list[tuple[str, Process]] = []
    for number, shard in enumerate(data["shards"]):
        processes.append((shard["leader"], ("leader", number, shard.get("region", regions[0]))))
        processes += [
            (f["address"], ("follower", number, f["region"])) for f in shard.get("followers", [])
        ]
    processes += [(m["address"], ("cm", -1, m["region"])) for m in data.get("cm", [])]
    addresses = [address for address, _ in processes]
    assert len(set(addresses)) == len(addresses), f"an address used twice: {addresses}"
    return dict(processes)


def kubernetes_cluster() -> dict[str, Any]:
    return tomllib.loads(kubernetes_cluster_text())


# --- (a) the manifests are Kubernetes objects -------------------------------------------


def test_the_manifests_hold_every_object_of_the_deployment() -> None:
    kinds = {document["kind"] for _, document in DOCUMENTS}
    assert {"Namespace", "ConfigMap", "Secret", "Service", "StatefulSet"} <= kinds, kinds
    assert [n["metadata"]["name"] for n in of_kind("Namespace")] == [NAMESPACE]
    for _, document in DOCUMENTS:
        if document["kind"] != "Namespace":
            assert document["metadata"].get("namespace") == NAMESPACE, document["metadata"]


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize(
    "document", [d for _, d in DOCUMENTS],
    ids=[f"{f}:{d['kind']}/{d['metadata']['name']}" for f, d in DOCUMENTS],
)
def test_every_manifest_validates_strictly(document: dict[str, Any], version: str) -> None:
    # An unknown kind raises SchemaNotFoundError (and fails the test) too.
    problem = None
    try:
        kubernetes_validate.validate(document, version, strict=True)
    except kubernetes_validate.ValidationError as error:
        problem = f"{'.'.join(str(part) for part in error.path)}: {error.message}"
    assert problem is None, f"{document['kind']}/{document['metadata']['name']}: {problem}"


# --- (b) the pods' command lines ---------------------------------------------------------


@pytest.mark.parametrize("statefulset", STATEFULSETS, ids=statefulset_id)
def test_pod_args_are_a_serve_command_of_the_statefulsets_role(statefulset: dict[str, Any]) -> None:
    region, role = name_parts(statefulset)
    replicas = statefulset["spec"]["replicas"]
    shards = len(kubernetes_cluster()["shards"])
    assert replicas == (1 if role == "cm" else shards)
    for ordinal in range(replicas):
        serve = pod_serve(statefulset, ordinal)
        assert serve.command == "serve"
        assert serve.role == role
        assert not serve.rejoin, "start.sh adds --rejoin on restarts; the args never carry it"
        assert serve.break_step is None
        if role == "cm":
            assert serve.region == region
        else:
            assert serve.shard == ordinal, "a leader's or follower's pod ordinal is its shard"
            assert serve.region == (region if role == "follower" else None)
        assert mounted_files(statefulset).get(str(serve.config)) == (
            "configMap", "meridian-cluster", "cluster.toml"
        ), f"--config {serve.config} is not the ConfigMap's cluster.toml"
    if role != "cm":
        assert "$(POD_INDEX)" in container(statefulset)["args"]
        env = {e["name"]: e for e in container(statefulset).get("env", [])}
        assert env["POD_INDEX"]["valueFrom"]["fieldRef"]["fieldPath"] == POD_INDEX_FIELD


@pytest.mark.parametrize("statefulset", STATEFULSETS, ids=statefulset_id)
def test_pods_start_through_start_sh_from_the_configmap(statefulset: dict[str, Any]) -> None:
    command = container(statefulset)["command"]
    assert command[0] == "/bin/sh"
    files = mounted_files(statefulset)
    assert files.get(command[1]) == ("configMap", "meridian-cluster", "start.sh")
    beside = f"{Path(command[1]).parent}/preflight.py"  # start.sh runs it from its own folder
    assert files.get(beside) == ("configMap", "meridian-cluster", "preflight.py")
    # start.sh keeps its marker on a volume that outlives the pod (a volumeClaimTemplate):
    # a pod made again must rejoin too.
    script = by_name("ConfigMap")["meridian-cluster"]["data"]["start.sh"]
    match = re.search(r'state="\$\{MERIDIAN_STATE_DIR:-([^}]+)\}"', script)
    assert match, "start.sh names its state directory"
    assert match[1] in writable_mounts(statefulset, claims_only=True)
    assert "MERIDIAN_STATE_DIR" not in {e["name"] for e in container(statefulset).get("env", [])}


@pytest.fixture(scope="module")
def pod_etc(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A pod's /etc/meridian in a temporary directory: the ConfigMap's start.sh and
    preflight.py, its cluster file with each host name replaced by an address of its own on
    127.0.0.0/8 (the pods' names do not resolve here) and [security] pointing at real
    certificates that `meridian certs` made."""
    from store.config import load
    from store.node.certs import write_cluster_certs

    etc = tmp_path_factory.mktemp("etc-meridian")
    data = kubernetes_cluster()
    text = kubernetes_cluster_text()
    hosts = sorted({address.rsplit(":", 1)[0] for address in cluster_processes(data)})
    for number, host in enumerate(hosts):
        text = text.replace(f'"{host}:', f'"127.0.0.{number + 2}:')
    cert_dir = data["security"]["cert_dir"].rstrip("/")
    (etc / "cluster.toml").write_text(text.replace(f'"{cert_dir}', f'"{etc / "certs"}'))
    write_cluster_certs(load(etc / "cluster.toml"), days=1)
    configmap = by_name("ConfigMap")["meridian-cluster"]["data"]
    for key in ("start.sh", "preflight.py"):
        (etc / key).write_text(configmap[key])
    return etc


def run_start_sh(
    etc: Path, tmp_path: Path, arguments: list[str], config: Path | None = None,
    **environment: str,
) -> tuple[subprocess.CompletedProcess[str], list[str] | None]:
    """Runs start.sh as the pod does, its state directory in ``tmp_path``, with a stand-in
    ``meridian`` that records its arguments; returns the result and those arguments (None:
    meridian was not started). ``--config`` is replaced by ``config`` (default: the sandbox's)."""
    bin_dir = tmp_path / "bin"
    if not bin_dir.exists():
        bin_dir.mkdir()
        (bin_dir / "meridian").write_text('#!/bin/sh\nprintf "%s\\n" "$@" > "$ARGS_OUT"\n')
        (bin_dir / "python3").write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
        for tool in bin_dir.iterdir():
            tool.chmod(0o755)
    state = tmp_path / "state"
    state.mkdir(exist_ok=True)
    record = tmp_path / "args"
    record.unlink(missing_ok=True)
    config = config or etc / "cluster.toml"
    arguments = [str(config) if a == "/etc/meridian/cluster.toml" else a for a in arguments]
    result = subprocess.run(
        ["/bin/sh", str(etc / "start.sh"), *arguments],
        env={"PATH": f"{bin_dir}:/usr/bin:/bin", "PYTHONPATH": str(REPO),
             "MERIDIAN_STATE_DIR": str(state), "ARGS_OUT": str(record), **environment},
        capture_output=True, text=True, timeout=60, check=False,
    )
    recorded = record.read_text().splitlines() if record.exists() else None
    if recorded is not None:
        recorded = ["/etc/meridian/cluster.toml" if a == str(config) else a for a in recorded]
    return result, recorded


@pytest.mark.parametrize("statefulset", STATEFULSETS, ids=statefulset_id)
def test_start_sh_rejoins_after_the_first_start(
    statefulset: dict[str, Any], pod_etc: Path, tmp_path: Path
) -> None:
    """Every role alike, a CM member included: the first start runs the args as given, and
    every later start (here two) adds --rejoin."""
    _, role = name_parts(statefulset)
    arguments = pod_arguments(statefulset, statefulset["spec"]["replicas"] - 1)
    first, recorded = run_start_sh(pod_etc, tmp_path, arguments)
    assert first.returncode == 0, first.stderr
    assert recorded == arguments
    assert (tmp_path / "state" / "meridian.started").exists(), "the first start leaves a marker"
    for restart in ("second", "third"):
        again, recorded = run_start_sh(pod_etc, tmp_path, arguments)
        assert again.returncode == 0, f"{role}: the {restart} start failed: {again.stderr}"
        assert recorded == [*arguments, "--rejoin"], f"{role}: the {restart} start"
        serve = parse_serve(recorded, "start.sh's restart")
        assert serve.rejoin
        assert serve.role == role


def test_preflight_stops_a_start_on_the_placeholder_secrets(pod_etc: Path, tmp_path: Path) -> None:
    """With the repository's placeholder Secrets, a pod neither starts nor leaves its marker:
    the start after the real Secrets are in is the first one."""
    placeholders = tmp_path / "certs"
    placeholders.mkdir()
    for secret in of_kind("Secret"):
        for key, value in secret["data"].items():
            (placeholders / key).write_bytes(base64.b64decode(value))
    config = tmp_path / "cluster.toml"
    text = (pod_etc / "cluster.toml").read_text()
    config.write_text(text.replace(f'"{pod_etc / "certs"}', f'"{placeholders}'))
    (leaders,) = [s for s in STATEFULSETS if name_parts(s)[1] == "leader"]
    arguments = pod_arguments(leaders, 0)
    # The real files, one after the other: each placeholder left stops the start.
    for real in ("cluster.secret", "shard-0.key", "shard-0.pem", "ca.pem"):  # preflight order
        result, recorded = run_start_sh(pod_etc, tmp_path, arguments, config)
        assert recorded is None, f"started with a placeholder {real}"
        why = "not hex" if real == "cluster.secret" else f"{placeholders / real} is not a PEM"
        assert why in result.stderr, result.stderr
        assert not (tmp_path / "state" / "meridian.started").exists()
        (placeholders / real).write_bytes((pod_etc / "certs" / real).read_bytes())
    result, recorded = run_start_sh(pod_etc, tmp_path, arguments, config)
    assert result.returncode == 0, result.stderr
    assert recorded == arguments, "the first start that passes is a first start (no --rejoin)"


def test_preflight_waits_for_the_names_to_resolve(pod_etc: Path, tmp_path: Path) -> None:
    """The pods' real names do not resolve on this machine: the start waits for them (here
    not at all), then stops without a marker."""
    config = tmp_path / "cluster.toml"
    text = (pod_etc / "cluster.toml").read_text()
    hosts = sorted({a.rsplit(":", 1)[0] for a in cluster_processes(kubernetes_cluster())})
    for number, host in enumerate(hosts):
        text = text.replace(f'"127.0.0.{number + 2}:', f'"{host}:')
    config.write_text(text)
    (followers, *_) = [s for s in STATEFULSETS if name_parts(s)[1] == "follower"]
    result, recorded = run_start_sh(
        pod_etc, tmp_path, pod_arguments(followers, 1), config, MERIDIAN_NAMES_WAIT_S="0"
    )
    assert result.returncode != 0
    assert recorded is None
    assert "do not resolve" in result.stderr, result.stderr
    assert not (tmp_path / "state" / "meridian.started").exists()


# --- (e) the cluster file and the pods ---------------------------------------------------


def test_cluster_file_names_exactly_the_processes_the_statefulsets_run() -> None:
    from_pods: dict[str, Process] = {}
    for statefulset in STATEFULSETS:
        rpc_port, _ = container_ports(statefulset)["rpc"]
        for ordinal in range(statefulset["spec"]["replicas"]):
            address = f"{pod_dns_name(statefulset, ordinal)}:{rpc_port}"
            assert address not in from_pods, f"two pods at {address}"
            from_pods[address] = pod_process(statefulset, ordinal)
    from_file = cluster_processes(kubernetes_cluster())
    assert sorted(from_pods.items()) == sorted(from_file.items())
    # Three regions, two shards: a leader and two followers per shard, a CM member per region.
    roles = sorted(role for role, _, _ in from_file.values())
    assert roles == ["cm"] * 3 + ["follower"] * 4 + ["leader"] * 2


@pytest.mark.parametrize("statefulset", STATEFULSETS, ids=statefulset_id)
def test_each_statefulset_has_a_headless_service_naming_its_pods(
    statefulset: dict[str, Any],
) -> None:
    services = by_name("Service")
    service = services.get(statefulset["spec"]["serviceName"])
    assert service is not None, f"no Service {statefulset['spec']['serviceName']}"
    # A StatefulSet's pods get DNS names from a headless Service.
    assert service["spec"].get("clusterIP") == "None"
    # A server resolves its own name to bind it before it is ready.
    assert service["spec"].get("publishNotReadyAddresses") is True
    selector = {"matchLabels": service["spec"]["selector"]}
    for other in STATEFULSETS:
        chosen = selects(selector, pod_labels(other, 0))
        assert chosen == (other is statefulset), (
            f"Service {service['metadata']['name']} selects {statefulset_id(other)}: {chosen}"
        )
    assert selects(statefulset["spec"]["selector"], pod_labels(statefulset, 0))
    ports = {p["name"]: (p["port"], p.get("protocol", "TCP")) for p in service["spec"]["ports"]}
    assert ports == container_ports(statefulset)


@pytest.mark.parametrize("statefulset", STATEFULSETS, ids=statefulset_id)
def test_ports_probes_and_region_follow_the_cluster_file(statefulset: dict[str, Any]) -> None:
    cluster = kubernetes_cluster()["cluster"]
    region, _ = name_parts(statefulset)
    ports = container_ports(statefulset)
    rpc, protocol = ports["rpc"]
    assert protocol == "UDP", "the RPC endpoints speak UDP"
    assert ports["replication"] == (rpc + cluster.get("replication_port_offset", 1000), "TCP")
    assert ports["metrics"] == (rpc + cluster["metrics_port_offset"], "TCP")
    assert len(ports) == 3
    spec = container(statefulset)
    for probe in ("readinessProbe", "livenessProbe"):
        assert spec[probe]["tcpSocket"]["port"] in ("replication", ports["replication"][0]), probe
    annotations = statefulset["spec"]["template"]["metadata"].get("annotations", {})
    assert annotations.get("prometheus.io/port") == str(ports["metrics"][0])
    assert annotations.get("prometheus.io/path") == "/metrics"
    assert statefulset["spec"]["template"]["spec"]["nodeSelector"] == {REGION_LABEL: region}
    assert {"requests", "limits"} <= set(spec["resources"])
    for ordinal in range(statefulset["spec"]["replicas"]):
        assert pod_process(statefulset, ordinal)[2] == region


def test_cluster_file_is_for_real_regions_on_writable_volumes() -> None:
    data = kubernetes_cluster()
    assert "wan" not in data, "real regions have real delay: no [wan] emulation"
    run_dir = data["cluster"]["run_dir"]
    assert run_dir.startswith("/"), "a relative run_dir is in the (read-only) ConfigMap's directory"
    assert data["cluster"]["metrics_port_offset"] == 2000
    assert data["cluster"].get("python_path", []) == []
    for statefulset in STATEFULSETS:
        mounts = writable_mounts(statefulset)
        assert any(run_dir == m or run_dir.startswith(m.rstrip("/") + "/") for m in mounts), (
            f"{statefulset_id(statefulset)}: run_dir {run_dir} is on none of {mounts}"
        )
    security = data["security"]
    assert security["tls"] is True
    cert_dir = security["cert_dir"].rstrip("/")
    assert security["ca"] == f"{cert_dir}/ca.pem"
    assert security["secret_file"] == f"{cert_dir}/cluster.secret"


def test_one_secret_per_process_with_its_certificate_the_ca_and_the_cluster_secret() -> None:
    processes = {process_name(p) for p in cluster_processes(kubernetes_cluster()).values()}
    secrets = of_kind("Secret")
    owners = {}
    shared: dict[str, set[bytes]] = {"ca.pem": set(), "cluster.secret": set()}
    for secret in secrets:
        data = secret["data"]
        names = [key[: -len(".pem")] for key in data if key.endswith(".pem") and key != "ca.pem"]
        assert len(names) == 1, f"{secret['metadata']['name']}: one process's certificate"
        (name,) = names
        assert sorted(data) == sorted([f"{name}.pem", f"{name}.key", "ca.pem", "cluster.secret"])
        for key, value in data.items():
            decoded = base64.b64decode(value, validate=True)
            assert b"PLACEHOLDER" in decoded, f"{key}: the repository holds placeholders only"
            if key in shared:
                shared[key].add(decoded)
        assert name not in owners, f"two Secrets for {name}"
        owners[name] = secret["metadata"]["name"]
    assert set(owners) == processes
    assert all(len(values) == 1 for values in shared.values()), "one CA and one cluster secret"


@pytest.mark.parametrize("statefulset", STATEFULSETS, ids=statefulset_id)
def test_each_pod_mounts_its_own_certificate_and_key(statefulset: dict[str, Any]) -> None:
    security = kubernetes_cluster()["security"]
    cert_dir = security["cert_dir"].rstrip("/")
    files = mounted_files(statefulset)
    assert files.get(security["ca"], ("",) * 3)[2] == "ca.pem"
    assert files.get(security["secret_file"], ("",) * 3)[2] == "cluster.secret"
    for ordinal in range(statefulset["spec"]["replicas"]):
        name = process_name(pod_process(statefulset, ordinal))
        for suffix in (".pem", ".key"):
            kind, secret, key = files.get(f"{cert_dir}/{name}{suffix}", ("", "", ""))
            assert kind == "secret" and key == f"{name}{suffix}", (
                f"{statefulset_id(statefulset)}-{ordinal} has no {cert_dir}/{name}{suffix}"
            )
            assert f"{name}.pem" in object_keys("secret", secret), f"{secret} is not {name}'s"


def test_meridian_certs_makes_the_files_the_secrets_hold(tmp_path: Path) -> None:
    """`meridian certs` on the ConfigMap's cluster file (its [security] paths moved to a
    temporary directory) writes every file the Secrets hold, under the same names, and the
    CA's key, which no Secret holds; each pod finds its process's files where the server
    looks for them."""
    from store.config import from_dict
    from store.node.certs import write_cluster_certs

    data = kubernetes_cluster()
    cert_dir = data["security"]["cert_dir"].rstrip("/")
    moved = {key: value.replace(cert_dir, str(tmp_path)) if isinstance(value, str) else value
             for key, value in data["security"].items()}
    written = write_cluster_certs(from_dict({**data, "security": moved}), days=1)
    made = {path.name for path in written}
    held = {key for secret in of_kind("Secret") for key in secret["data"]}
    assert made - held == {"ca.key"}, "only the CA's key stays out of the cluster"
    assert held <= made
    config = from_dict(data)
    assert config.security is not None
    for statefulset in STATEFULSETS:
        files = mounted_files(statefulset)
        for ordinal in range(statefulset["spec"]["replicas"]):
            role, shard, region = pod_process(statefulset, ordinal)
            node = config.node(role, shard, region)
            for path in config.security.identity_files(node):
                assert str(path) in files, f"{statefulset_id(statefulset)}-{ordinal}: {path}"


def test_process_names_are_meridians() -> None:
    """The test's process names (of the certificate files) are Meridian's own."""
    from store.config import ReplicaNode

    for address, process in cluster_processes(kubernetes_cluster()).items():
        host, port = address.split(":")
        role, shard, region = process
        assert ReplicaNode(role, shard, region, (host, int(port))).name == process_name(process)


def test_disruption_budgets_take_a_minority_of_a_shard_and_one_cm_member() -> None:
    budgets = of_kind("PodDisruptionBudget")
    if not budgets:
        pytest.skip("no PodDisruptionBudget (optional)")
    pods = [
        (pod_labels(s, ordinal), pod_process(s, ordinal))
        for s in STATEFULSETS for ordinal in range(s["spec"]["replicas"])
    ]
    covered = set()
    for budget in budgets:
        selector = budget["spec"]["selector"]
        chosen = {process for labels, process in pods if selects(selector, labels)}
        allowed = budget["spec"]["maxUnavailable"]
        if {role for role, _, _ in chosen} == {"cm"}:
            # An evicted CM member comes back on its volume and rejoins; the other two keep
            # the CM working meanwhile, so one at a time, and never a majority.
            assert allowed == 1, "one CM member at a time may go (and never none)"
            assert allowed <= (len(chosen) - 1) // 2, "more than a minority of the CM"
            assert len(chosen) == 3, "every CM member"
        else:
            shards = {shard for _, shard, _ in chosen}
            assert len(shards) == 1 and "cm" not in {role for role, _, _ in chosen}, chosen
            assert allowed <= (len(chosen) - 1) // 2, "more than a minority of a shard"
            assert len(chosen) == 3, "every replica of the shard"
        covered |= chosen
    assert covered == {process for _, process in pods}


@pytest.mark.parametrize("which", sorted(CLUSTER_FILES))
def test_meridian_loads_the_cluster_file(which: str) -> None:
    from store.config import from_dict

    data = tomllib.loads(CLUSTER_FILES[which]())
    config = from_dict(data)
    assert {node.address: (node.role, node.shard, node.region) for node in config.nodes()} == (
        cluster_processes(data)
    )


# --- (c) the systemd units ---------------------------------------------------------------

UNITS = {role: SYSTEMD / f"meridian-{role}@.service" for role in ("leader", "follower", "cm")}
# The instance each unit is checked with: a shard, or a region for a CM member.
INSTANCES = {"leader": "1", "follower": "1", "cm": "eu"}
STATE_DIRECTORY = "/var/lib/meridian"


def read_unit(path: Path) -> configparser.ConfigParser:
    unit = configparser.ConfigParser(strict=False, interpolation=None, delimiters=("=",))
    unit.optionxform = str  # type: ignore[assignment,method-assign]
    unit.read_string(path.read_text())
    return unit


def unit_values(path: Path, section: str, key: str) -> list[str]:
    """Every value of ``key`` in ``section`` (a key may be given more than once)."""
    values, current = [], None
    for line in path.read_text().splitlines():
        line = line.strip()
        if line.startswith("[") and line.endswith("]"):
            current = line[1:-1]
        elif current == section and line.startswith(f"{key}="):
            values.append(line[len(key) + 1 :])
    return values


def environment_file(text: str) -> dict[str, str]:
    lines = [line for line in text.splitlines() if line.strip() and not line.startswith("#")]
    pairs = [line.split("=", 1) for line in lines]
    return {key.strip(): value.strip() for key, value in pairs}


def specifiers(line: str, role: str, instance: str) -> str:
    """systemd's unit specifiers of the template ``role`` run as ``instance``."""
    prefix = f"meridian-{role}"
    values = {"i": instance, "I": instance, "p": prefix, "N": f"{prefix}@{instance}",
              "n": f"{prefix}@{instance}.service", "%": "%"}
    unknown = set(re.findall(r"%(.)", line)) - set(values)
    assert not unknown, f"specifiers this test does not know: {unknown}"
    return re.sub(r"%(.)", lambda m: values[m[1]], line)


def command_line(line: str, environment: dict[str, str]) -> list[str]:
    """An Exec line's words as systemd makes them: "$NAME" alone is split into zero or more
    words, "${NAME}" is replaced in place."""
    words: list[str] = []
    for word in shlex.split(line.lstrip("-@:+!")):
        alone = re.fullmatch(r"\$(\w+)", word)
        if alone:
            words += environment.get(alone[1], "").split()
            continue
        word = re.sub(r"\$\{(\w+)\}", lambda m: environment[m[1]], word)
        assert "$" not in word, f"unexpanded {word!r}"
        words.append(word)
    return words


def unit_environment(path: Path, role: str, state: Path | None) -> dict[str, str]:
    """The environment the unit's EnvironmentFiles give: meridian.env stands for
    /etc/meridian/meridian.env, ``state`` (None: nothing there yet) for /var/lib/meridian."""
    environment = {}
    for value in unit_values(path, "Service", "EnvironmentFile"):
        optional = value.startswith("-")
        file = specifiers(value.lstrip("-"), role, INSTANCES[role])
        if file == "/etc/meridian/meridian.env":
            environment |= environment_file((SYSTEMD / "meridian.env").read_text())
            continue
        assert file.startswith(f"{STATE_DIRECTORY}/"), f"unknown EnvironmentFile {file}"
        local = None if state is None else state / file[len(STATE_DIRECTORY) + 1 :]
        if local is not None and local.exists():
            environment |= environment_file(local.read_text())
        else:
            assert optional, f"{file} does not exist before the first start: it must be optional"
    return environment


def run_in(state: Path, role: str, line: str) -> subprocess.CompletedProcess[str]:
    """Runs an ExecStartPre/Post line with /var/lib/meridian moved to ``state``."""
    assert "$" not in line, "systemd would expand it: a marker command uses no variables"
    words = command_line(specifiers(line, role, INSTANCES[role]), {})
    words = [w.replace(STATE_DIRECTORY, str(state)) for w in words]
    return subprocess.run(words, capture_output=True, text=True, timeout=30, check=False)


def unit_serve(path: Path, role: str, environment: dict[str, str]) -> argparse.Namespace:
    line = specifiers(read_unit(path)["Service"]["ExecStart"], role, INSTANCES[role])
    words = command_line(line, environment)
    assert words[0].startswith("/") and Path(words[0]).name == "meridian", words[0]
    serve = parse_serve(words[1:], path.name)
    assert serve.command == "serve"
    return serve


@pytest.mark.parametrize("role", sorted(UNITS))
def test_unit_has_its_sections_and_hardening(role: str) -> None:
    unit = read_unit(UNITS[role])
    assert {"Unit", "Service", "Install"} <= set(unit.sections())
    service = unit["Service"]
    assert service["User"] == "meridian"
    assert service["Group"] == "meridian"
    assert int(service["LimitNOFILE"]) >= 65536
    assert service["ProtectSystem"] == "strict"
    assert service["NoNewPrivileges"] == "yes"
    assert service["StateDirectory"] == "meridian", f"{STATE_DIRECTORY} is writable"
    assert unit["Install"]["WantedBy"] == "multi-user.target"


@pytest.mark.parametrize("role", sorted(UNITS))
def test_unit_execstart_is_a_serve_command_of_its_role(role: str) -> None:
    path = UNITS[role]
    serve = unit_serve(path, role, unit_environment(path, role, None))
    assert serve.role == role
    assert not serve.rejoin, "the first start of a process is no rejoin"
    assert str(serve.config) == "/etc/meridian/cluster.toml"
    if role == "cm":
        assert serve.region == INSTANCES["cm"]
        process: Process = ("cm", -1, serve.region)
    else:
        assert serve.shard == int(INSTANCES[role])
        if role == "follower":
            machine = environment_file((SYSTEMD / "meridian.env").read_text())
            assert serve.region == machine["MERIDIAN_REGION"]
        data = tomllib.loads((SYSTEMD / "cluster.toml").read_text())
        first_region = data["regions"][0]["name"]
        region = serve.region or data["shards"][serve.shard].get("region", first_region)
        process = (role, serve.shard, region)
    processes = cluster_processes(tomllib.loads((SYSTEMD / "cluster.toml").read_text()))
    assert process in processes.values(), f"deploy/systemd/cluster.toml has no {process}"


RESTART_SETTINGS = {
    "Service": ("Restart", "RestartSec", "RestartPreventExitStatus"),
    "Unit": ("StartLimitIntervalSec", "StartLimitBurst"),
}


@pytest.mark.parametrize("role", sorted(UNITS))
def test_a_unit_restarts_on_failure_but_not_after_a_broken_invariant(role: str) -> None:
    unit = read_unit(UNITS[role])
    service = unit["Service"]
    assert service.get("Restart") == "on-failure", "a failed process is started again"
    assert service.get("RestartSec") == "1s"
    assert "70" in service.get("RestartPreventExitStatus", "").split(), (
        "a broken invariant (exit status 70) is a bug: the unit is not restarted"
    )
    assert "ExecStartPre" not in service, "no start is refused"
    # Every role restarts alike: the CM's unit as the replicas'.
    follower = read_unit(UNITS["follower"])
    for section, keys in RESTART_SETTINGS.items():
        for key in keys:
            assert unit[section].get(key) is not None, f"{UNITS[role].name}: no {key}"
            assert unit[section].get(key) == follower[section].get(key), key


@pytest.mark.parametrize("role", sorted(UNITS))
def test_a_restarted_process_rejoins(role: str, tmp_path: Path) -> None:
    """The first start runs the command as written and leaves the marker; every later
    start, a CM member's too, has --rejoin."""
    path = UNITS[role]
    first = unit_serve(path, role, unit_environment(path, role, tmp_path))
    assert not first.rejoin, "nothing in the state directory yet: a first start"
    (post,) = unit_values(path, "Service", "ExecStartPost")
    for start in ("first", "second"):  # what each start leaves behind
        marked = run_in(tmp_path, role, post)
        assert marked.returncode == 0, marked.stderr
        serve = unit_serve(path, role, unit_environment(path, role, tmp_path))
        assert serve.rejoin, f"the start after the {start} must rejoin (--rejoin)"
        assert serve.role == role
        assert serve.region == first.region and serve.shard == first.shard


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze")
def test_systemd_analyze_verify_reports_nothing_but_the_missing_install(tmp_path: Path) -> None:
    instances = []
    for role, path in UNITS.items():
        instance = tmp_path / f"meridian-{role}@{INSTANCES[role]}.service"
        instance.write_text(path.read_text())
        instances.append(str(instance))
    result = subprocess.run(
        ["systemd-analyze", "verify", *instances],
        capture_output=True, text=True, timeout=60, check=False,
    )
    # Meridian is installed at /opt/meridian on the servers, not on this machine.
    missing = re.compile(r".*: Command /opt/meridian/bin/meridian is not executable: .*")
    complaints = [
        line for line in (result.stdout + result.stderr).splitlines()
        if line.strip() and not missing.fullmatch(line)
    ]
    assert not complaints, "\n".join(complaints)


# --- (d) the container image -------------------------------------------------------------


def containerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, its arguments) in order, continuation lines joined."""
    instructions: list[tuple[str, str]] = []
    pending = ""
    for raw in CONTAINERFILE.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if pending and line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        keyword, _, rest = (pending + line).strip().partition(" ")
        instructions.append((keyword.upper(), rest.strip()))
        pending = ""
    assert not pending, "a continuation line at the end"
    return instructions


def stages() -> list[tuple[str, str | None, list[tuple[str, str]]]]:
    """(base image, stage name, instructions) per FROM."""
    result: list[tuple[str, str | None, list[tuple[str, str]]]] = []
    for keyword, rest in containerfile_instructions():
        if keyword == "FROM":
            words = rest.split()
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            result.append((words[0], name, []))
        else:
            assert result, f"{keyword} before FROM"
            result[-1][2].append((keyword, rest))
    return result


def copy_sources(rest: str) -> tuple[list[str], list[str]]:
    """(options, sources) of a COPY."""
    words = json.loads(rest) if rest.startswith("[") else shlex.split(rest)
    options = [w for w in words if w.startswith("--")]
    paths = [w for w in words if not w.startswith("--")]
    assert len(paths) >= 2, f"COPY {rest}: sources and a destination"
    return options, paths[:-1]


def test_containerfile_runs_meridian_as_a_non_root_user() -> None:
    all_stages = stages()
    assert all(base == "python:3.11-slim" for base, _, _ in all_stages)
    _, _, final = all_stages[-1]
    entrypoints = [rest for keyword, rest in final if keyword == "ENTRYPOINT"]
    assert entrypoints, "the final stage has an ENTRYPOINT"
    assert json.loads(entrypoints[-1]) == ["meridian"]
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert "meridian" in pyproject["project"]["scripts"]
    users = [rest for keyword, rest in final if keyword == "USER"]
    assert users, "the final stage sets a USER"
    assert users[-1].split(":")[0] not in ("root", "0")


def test_containerfile_copies_what_the_package_build_needs() -> None:
    names = {name for _, name, _ in stages() if name}
    copied: list[str] = []
    for _, _, instructions in stages():
        for keyword, rest in instructions:
            if keyword == "ADD":
                pytest.fail(f"ADD {rest}: use COPY")
            if keyword != "COPY":
                continue
            options, sources = copy_sources(rest)
            stage = [o.split("=", 1)[1] for o in options if o.startswith("--from=")]
            if stage:
                assert stage[0] in names, f"COPY --from={stage[0]}: no such stage"
                continue
            for source in sources:
                assert not Path(source).is_absolute() and ".." not in Path(source).parts
                assert (REPO / source).exists(), f"COPY {source}: not in the repository"
                copied.append(source.rstrip("/"))

    def is_copied(path: str) -> bool:
        return any(path == c or path.startswith(f"{c}/") or c == "." for c in copied)

    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    needed = ["pyproject.toml", "setup.py", pyproject["project"]["readme"]]
    needed += re.findall(r'"(native/[^"]+)"', (REPO / "setup.py").read_text())
    for pattern in pyproject["tool"]["setuptools"]["packages"]["find"]["include"]:
        needed += [p.name for p in REPO.glob(pattern.split(".")[0]) if (p / "__init__.py").exists()]
    assert "store" in needed
    missing = [path for path in needed if not is_copied(path)]
    assert not missing, f"the image's build does not get {missing}"
    runs = [rest for _, _, steps in stages() for keyword, rest in steps if keyword == "RUN"]
    assert any(re.search(r"pip install\b.* \.(\s|$)", run) for run in runs), "pip install ."
    assert any("build-essential" in run for run in runs), "gcc for native/"
