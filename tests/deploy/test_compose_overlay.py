"""The compose overlay in real containers: images built here, 3 VNs x 3 replicas speaking
TLS (mutual between brokers, client certificates required), traffic from the host through
published ports, clients without our certificate refused, a replica attached live to the
middle VN and detached again (``trellis placement apply``'s compose side), a replica killed
and another cut off mid-stream.

Needs a Docker engine: one that answers, or one ``deploy/dockerd.sh`` can start (root and
Debian's docker.io; ``bash deploy/setup.sh`` installs it). Anything started here is removed
afterwards (containers, the network, volumes; a dockerd this test started is stopped).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import subprocess
import time
import urllib.parse
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from broker.client import Client, Subscription, parse_endpoint
from broker.errors import ConnectionLost, TLSError, TrellisTimeout
from broker.tools import cli
from broker.tools.local import ClientTLS, OverlayError, fetch_json, free_ports
from broker.tools.placement_compose import OVERRIDE_FILE, ComposeReplicas
from security.ca import create_ca, issue, save_ca, write_issued
from tests.test_deploy import DASHBOARD, dashboard_queries, load_compose_gen

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parent.parent.parent
COMPOSE_FILE = ROOT / "docker-compose.yml"


def docker_client() -> str | None:
    """Debian's client first: another ``docker`` earlier on PATH may misbehave."""
    return "/usr/bin/docker" if os.access("/usr/bin/docker", os.X_OK) else shutil.which("docker")


def run(cmd: list[str], timeout: float = 120, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        cmd, capture_output=True, text=True, timeout=timeout, env=env, check=False, cwd=ROOT
    )
    if done.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} exited {done.returncode}:\n{done.stderr[-3000:]}")
    return done.stdout


@pytest.fixture(scope="module")
def docker() -> Iterator[str]:
    """A Docker client whose engine answers: a running one, or one started (and later
    stopped) by deploy/dockerd.sh. Skips only where no engine can be started."""
    client = docker_client()
    compose = shutil.which("docker-compose")
    if client is None or compose is None:
        pytest.skip("no docker client or docker-compose (bash deploy/setup.sh installs them)")
    answers = (
        subprocess.run([client, "info"], capture_output=True, timeout=30, check=False).returncode
        == 0
    )
    started = False
    if not answers:
        if shutil.which("dockerd") is None and not os.access("/usr/sbin/dockerd", os.X_OK):
            pytest.skip("no Docker engine answers and there is no dockerd to start")
        if os.geteuid() != 0:
            pytest.skip("no Docker engine answers and starting dockerd needs root")
        start = subprocess.run(
            ["bash", "deploy/dockerd.sh", "start"],
            capture_output=True,
            text=True,
            cwd=ROOT,
            check=False,
        )
        if start.returncode != 0:
            pytest.skip(f"no Docker engine could be started here: {start.stderr.strip()}")
        started = True
    try:
        yield client
    finally:
        if started:
            subprocess.run(["bash", "deploy/dockerd.sh", "stop"], cwd=ROOT, timeout=60, check=False)


@dataclass
class ComposeOverlay:
    """A running compose project: its published ports by broker id, and how to drive it."""

    docker: str
    env: dict[str, str]
    project: str
    client_ports: dict[str, int]
    admin_ports: dict[str, int]
    prometheus_port: int
    manifest: Path
    tls: ClientTLS  # the host's client certificate (compose_gen.py keys issues it)

    def compose(self, *args: str, timeout: float = 180) -> str:
        cmd = ["docker-compose", "-f", str(COMPOSE_FILE), "-p", self.project, *args]
        return run(cmd, timeout, self.env)

    def container(self, service: str) -> str:
        return self.compose("ps", "-q", service).strip()

    def logs(self, service: str) -> str:
        """What a broker container wrote (the broker logs to stderr)."""
        done = subprocess.run(
            [self.docker, "logs", self.container(service)],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
        return done.stdout + done.stderr

    def endpoints(self, vn: str) -> list[str]:
        return [f"127.0.0.1:{p}" for b, p in sorted(self.client_ports.items()) if b.startswith(vn)]

    def health(self, broker_id: str) -> dict[str, object]:
        health: dict[str, object] = fetch_json(
            f"http://127.0.0.1:{self.admin_ports[broker_id]}/healthz"
        )
        return health

    def wait_linked(self, expected: dict[str, set[str]], timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        last: dict[str, object] = {}
        while time.monotonic() < deadline:
            try:
                last = {b: set(self.health(b)["links"]) for b in expected}  # type: ignore[call-overload]
            except (OSError, ValueError):
                time.sleep(0.5)
                continue
            if last == expected:
                return
            time.sleep(0.5)
        raise AssertionError(f"overlay links not up within {timeout} s: {last}")

    def prometheus(self, path: str, **query: str) -> dict[str, object]:
        url = f"http://127.0.0.1:{self.prometheus_port}{path}"
        if query:
            url += "?" + urllib.parse.urlencode(query)
        doc: dict[str, object] = fetch_json(url, timeout=5)
        return doc


@pytest.fixture(scope="module")
def overlay(docker: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ComposeOverlay]:
    """The images built (cached layers reused), then the compose overlay up on free host
    ports with fresh keys and certificates; torn down (containers, network, volumes)
    whatever happens."""
    started = time.monotonic()
    run(["bash", "deploy/images.sh"], timeout=900)
    print(f"images ready in {time.monotonic() - started:.1f} s")
    gen = load_compose_gen()
    keys = tmp_path_factory.mktemp("compose-keys")
    manifest = gen.write_keys(keys)
    tls = gen.compose_overlay(keys).client_tls()
    brokers = gen.compose_overlay().broker_ids
    ports = free_ports(2 * len(brokers) + 1)
    client_ports = dict(zip(brokers, ports, strict=False))
    admin_ports = dict(zip(brokers, ports[len(brokers) :], strict=False))
    env = {**os.environ, "TRELLIS_KEYS_DIR": str(keys), "TRELLIS_PROMETHEUS_PORT": str(ports[-1])}
    for b in brokers:
        env[f"TRELLIS_PORT_{gen.env_suffix(b)}"] = str(client_ports[b])
        env[f"TRELLIS_ADMIN_{gen.env_suffix(b)}"] = str(admin_ports[b])
    project = f"trellis-test-{uuid.uuid4().hex[:8]}"
    compose = ComposeOverlay(
        docker, env, project, client_ports, admin_ports, ports[-1], manifest, tls
    )
    try:
        up = time.monotonic()
        compose.compose("up", "-d")
        vn_of = {b: b.split(".")[0] for b in brokers}
        neighbours = {"b0": {"b1"}, "b1": {"b0", "b2"}, "b2": {"b1"}}
        expected = {b: {p for p in brokers if vn_of[p] in neighbours[vn_of[b]]} for b in brokers}
        compose.wait_linked(expected)
        print(f"compose overlay linked in {time.monotonic() - up:.1f} s")
        yield compose
    finally:
        down = time.monotonic()
        try:
            compose.compose("down", "--volumes", "--remove-orphans", "--timeout", "5")
        finally:
            left = run(
                [docker, "ps", "-aq", "--filter", f"label=com.docker.compose.project={project}"]
            )
            assert not left.strip(), f"containers left behind: {left}"
        print(f"compose overlay down in {time.monotonic() - down:.1f} s")


def wait_healthy(overlay: ComposeOverlay, container: str, timeout: float = 60) -> str:
    """The container's health status once it is healthy, or the last one seen followed by
    Docker's log of its checks (what each printed and when), for the failure message."""
    deadline = time.monotonic() + timeout
    while True:
        state = json.loads(run([overlay.docker, "inspect", container]))[0]["State"]
        health = state.get("Health", {})
        status = str(health.get("Status"))
        if status == "healthy":
            return status
        if time.monotonic() > deadline:
            checks = [
                f"{c.get('Start')} exit {c.get('ExitCode')}: {str(c.get('Output')).strip()}"
                for c in health.get("Log") or []
            ]
            return "\n".join([status, *checks])
        time.sleep(0.5)


def test_containers_run_as_non_root_and_report_healthy(overlay: ComposeOverlay) -> None:
    container = overlay.container("b1-1")
    assert wait_healthy(overlay, container) == "healthy"
    assert run([overlay.docker, "exec", container, "id", "-u"]).strip() == "10001"


def test_prometheus_scrapes_every_broker_and_answers_the_dashboard(
    overlay: ComposeOverlay,
) -> None:
    deadline = time.monotonic() + 60
    up: set[str] = set()
    while time.monotonic() < deadline:
        try:
            doc = overlay.prometheus("/api/v1/targets")
        except OSError:
            time.sleep(1)
            continue
        targets = doc["data"]["activeTargets"]  # type: ignore[index]
        up = {t["labels"]["instance"] for t in targets if t["health"] == "up"}
        if len(up) == len(overlay.client_ports):
            break
        time.sleep(1)
    assert up == {f"{b.replace('.', '-')}:9100" for b in overlay.client_ports}
    # Every query of the Grafana dashboard parses and runs in this Prometheus.
    doc = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    for expr in dashboard_queries(doc):
        if expr.startswith("label_values("):
            continue  # Grafana's own function, not PromQL
        promql = expr.replace("$vn", ".*").replace("$broker", ".*")
        answer = overlay.prometheus("/api/v1/query", query=promql)
        assert answer["status"] == "success", (expr, answer)
    answer = overlay.prometheus("/api/v1/query", query="trellis_broker_links")
    assert len(answer["data"]["result"]) == len(overlay.client_ports)  # type: ignore[index]


async def test_clients_without_our_certificate_are_refused_and_the_overlay_keeps_serving(
    overlay: ComposeOverlay, tmp_path: Path
) -> None:
    """The published client ports speak TLS only and want a certificate from the overlay's
    CA: a client with none, one with another CA's certificate and a plaintext client are
    each refused with a clear error, while the brokers stay linked and a certified client's
    plain and confidential publications still arrive, once each."""
    endpoints = overlay.endpoints("b1")
    with pytest.raises(TLSError, match="requires a client certificate") as no_cert:
        async with Client(endpoints, client_id="no-cert", connect_timeout=10, ca=overlay.tls["ca"]):
            pass
    assert "presented none" in no_cert.value.message

    ca = create_ca("Some other CA")
    save_ca(ca, tmp_path / "other")
    cert, key = write_issued(issue(ca, "mallory", "client"), ca, tmp_path / "other", "mallory")
    with pytest.raises(TLSError, match="refused this client's certificate"):
        async with Client(
            endpoints,
            client_id="mallory",
            connect_timeout=10,
            ca=overlay.tls["ca"],
            cert=cert,
            key=key,
        ):
            pass
    with pytest.raises((ConnectionLost, TrellisTimeout), match="needs ca="):
        async with Client(endpoints, client_id="plain", connect_timeout=3):
            pass
    # The broker says why it closed the foreign client's connection.
    deadline = time.monotonic() + 10
    while "certificate not issued by the project CA" not in (logs := overlay.logs("b1-0")):
        assert time.monotonic() < deadline, f"b1-0 logged no refused handshake:\n{logs[-2000:]}"
        await asyncio.sleep(0.5)

    brokers = sorted(overlay.client_ports)
    vn_of = {b: b.split(".")[0] for b in brokers}
    neighbours = {"b0": {"b1"}, "b1": {"b0", "b2"}, "b2": {"b1"}}
    want = {b: {p for p in brokers if vn_of[p] in neighbours[vn_of[b]]} for b in brokers}
    assert await wait_links(overlay, want, timeout=5) == want
    # The subscriber is given one replica's published port, as a user copying one line
    # might: the WELCOME tells it the others at their host ports (client_endpoints).
    async with (
        Client(overlay.endpoints("b0"), client_id="tls-pub", **overlay.tls) as pub,
        Client(
            overlay.endpoints("b2")[1],
            client_id="tls-sub",
            manifest=overlay.manifest,
            **overlay.tls,
        ) as sc,
        sc.subscribe("class = 'tls'") as sub,
    ):
        assert sorted(sc.replica_endpoints) == sorted(
            parse_endpoint(e) for e in overlay.endpoints("b2")
        )
        await pub.advertise("class = 'tls'")
        await asyncio.sleep(1.0)  # routing state settles across the three VNs
        for i in range(6):
            await pub.publish({"class": "tls", "i": i}, payload(i), confidential=bool(i % 2))
        await pub.drain(30)
        got = [await sub.get(20) for _ in range(6)]
        assert [(m.seq, m.payload, m.confidential) for m in got] == [
            (i + 1, payload(i), bool(i % 2)) for i in range(6)
        ]
        with pytest.raises(TrellisTimeout):
            await sub.get(1.0)


def splits_toward(overlay: ComposeOverlay, forwarders: list[str], vn: str) -> dict[int, int]:
    """Key shares the ``forwarders`` split toward ``vn``, by the replica count used."""
    counts: dict[int, int] = {}
    for broker in forwarders:
        splits = overlay.health(broker)["splits_by_scheme"]
        for scheme, n in splits.items():  # type: ignore[attr-defined]
            name, _, r = scheme.rpartition("/")
            if name == vn:
                counts[int(r)] = counts.get(int(r), 0) + n
    return counts


async def test_replicas_attach_to_the_middle_and_edge_vns_and_detach_while_publications_flow(
    overlay: ComposeOverlay, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Plain and confidential publications flow from the host (b0) to a subscriber at b2 over
    TLS while placement attaches a fourth replica to b1 in its own container and then
    detaches it: each arrives exactly once, in order, byte for byte; the new container runs
    its siblings' image, links to every replica of b0 and b2 and reports healthy; b0's
    replicas split toward b1 with r = 4 while it was there; after the detach its container
    is gone. Then a fourth replica joins b0, the publisher's own edge VN, and leaves again:
    the publisher on the host follows both changes (it dials the new container's published
    port and stops using it once it leaves). Beforehand, ``trellis placement`` with
    ``--compose`` reads the deployment (nine brokers running, the tree of their live links)
    and, asked for a dry run, lists the attach to b0 that its plan needs, changing nothing."""
    keys = overlay.manifest.parent
    replicas = ComposeReplicas(keys, COMPOSE_FILE, overlay.project, overlay.env, overlay.docker)
    forwarders = [b for b in sorted(overlay.client_ports) if b.startswith("b0")]
    published: list[tuple[int, bytes, bool]] = []
    stop = asyncio.Event()

    async def publish(pub: Client) -> None:
        i = 0
        while not stop.is_set():
            data = f"attach {i} ".encode() * 3 + bytes([i % 256])
            seq = await pub.publish({"class": "attach", "i": i}, data, confidential=bool(i % 2))
            published.append((seq, data, bool(i % 2)))
            i += 1
            await asyncio.sleep(0.01)

    async with (
        Client(overlay.endpoints("b0"), client_id="attach-pub", **overlay.tls) as pub,
        Client(
            overlay.endpoints("b2"), client_id="sub-3", manifest=overlay.manifest, **overlay.tls
        ) as sc,
        sc.subscribe("class = 'attach'") as sub,
    ):
        await pub.advertise("class = 'attach'")
        await asyncio.sleep(1.0)  # routing state settles across the three VNs
        config = tmp_path / "placement.toml"
        config.write_text('[placement]\nbudget = 10\npaths = ["b0 -> b2"]\n', encoding="utf-8")
        deployment = ["--dir", str(keys), "--compose", str(COMPOSE_FILE)]
        deployment += ["--project", overlay.project, "--config", str(config)]
        capsys.readouterr()
        planned = await asyncio.to_thread(cli.main, ["placement", "plan", *deployment, "--json"])
        plan = json.loads(capsys.readouterr().out)
        version = replicas.manifest.version
        dry = await asyncio.to_thread(cli.main, ["placement", "apply", *deployment, "--dry-run"])
        dry_run = capsys.readouterr().out
        assert replicas.manifest.version == version
        publisher = asyncio.create_task(publish(pub))
        try:
            await asyncio.sleep(1.0)
            attached = await asyncio.to_thread(replicas.attach, "b1")
            began = await asyncio.to_thread(splits_toward, overlay, forwarders, "b1")
            # Every docker command runs in a thread: on the event loop, a slow one would
            # hold the clients' heartbeats back and the brokers would close their links.
            container = (await asyncio.to_thread(replicas.compose, "ps", "-q", "b1-3")).strip()
            status = await asyncio.to_thread(wait_healthy, overlay, container)
            images = {}
            for c in (container, await asyncio.to_thread(overlay.container, "b1-0")):
                inspect = [overlay.docker, "inspect", "-f", "{{.Image}}", c]
                images[c] = (await asyncio.to_thread(run, inspect)).strip()
            running = await asyncio.to_thread(replicas.running)
            health = await asyncio.to_thread(fetch_json, running["b1.3"].admin + "/healthz")
            await asyncio.sleep(1.0)
            ended = await asyncio.to_thread(splits_toward, overlay, forwarders, "b1")
            joined_log = await asyncio.to_thread(run, [overlay.docker, "logs", container])
            detached = await asyncio.to_thread(replicas.detach, "b1")
            await asyncio.sleep(1.0)
            edge_attached = await asyncio.to_thread(replicas.attach, "b0")
            await asyncio.sleep(1.0)
            followed = (pub.membership_version, pub.vn_size, len(pub.endpoints))
            edge_detached = await asyncio.to_thread(replicas.detach, "b0")
            await asyncio.sleep(1.0)
        finally:
            stop.set()
            await publisher
            if (keys / OVERRIDE_FILE).exists():  # failed between attach and detach
                for left in ("b1-3", "b0-3"):
                    with contextlib.suppress(OverlayError):  # (not started)
                        await asyncio.to_thread(replicas.compose, "rm", "-f", "-s", "-v", left)
        await pub.drain(30)
        got: list[tuple[int, bytes, bool]] = []
        while len(got) < len(published):
            try:
                msg = await sub.get(20)
            except TrellisTimeout:
                break
            got.append((msg.seq, msg.payload, msg.confidential))
        with pytest.raises(TrellisTimeout):
            await sub.get(2.0)  # nothing more: each publication exactly once

    with capsys.disabled():
        print(f"attach {attached.seconds:.2f} s, detach {detached.seconds:.2f} s (containers)")
    assert planned == 0
    assert (plan["brokers_running"], plan["tree"]) == (9, "live links")
    assert [(c["vn"], c["current"], c["planned"]) for c in plan["diff"] if c["delta"]] == [
        ("b0", 3, 4)
    ]
    assert dry == 0
    assert "attach one replica to b0" in dry_run
    assert (edge_attached.broker, edge_detached.broker) == ("b0.3", "b0.3")
    assert (edge_attached.clients_behind, edge_detached.clients_behind) == (0, 0)
    assert followed == (edge_attached.version, 4, 4)
    assert replicas.manifest.members["b0"] == ("b0.0", "b0.1", "b0.2")
    assert (attached.action, attached.broker, detached.broker) == ("attach", "b1.3", "b1.3")
    assert len(published) > 100
    if got != published:  # say which broker gave up on what (the containers go with the module)
        missing = sorted({p[0] for p in published} - {g[0] for g in got})
        said = brokers_said(overlay, {"b1.3": joined_log})
        pytest.fail(f"missing seqs {missing}; brokers said:\n{said}")
    assert status == "healthy"
    assert len(set(images.values())) == 1, images  # its siblings' image, whatever the tag is now
    assert set(health["links"]) == {b for b in overlay.client_ports if b.startswith(("b0", "b2"))}
    assert not health["missing_links"]
    assert ended.get(4, 0) > began.get(4, 0), (began, ended)
    assert replicas.manifest.members["b1"] == ("b1.0", "b1.1", "b1.2")
    project = f"label=com.docker.compose.project={overlay.project}"
    service = "label=com.docker.compose.service=b1-3"
    gone = run([overlay.docker, "ps", "-aq", "--filter", project, "--filter", service])
    assert not gone.strip(), f"b1-3 left behind: {gone}"
    assert not (keys / OVERRIDE_FILE).exists()


def payload(i: int) -> bytes:
    return f"message {i} {'secret' if i % 2 else 'plain'}".encode()


async def stream(
    pub: Client, sub: Subscription, first: int, count: int, faults: dict[int, list[str]]
) -> list[tuple[int, bytes, bool]]:
    """Publish ``count`` messages (odd ones confidential), running ``faults[i]`` before
    message ``i``; return what the subscriber got: (seq, payload, confidential)."""
    for i in range(first, first + count):
        if i in faults:
            await asyncio.to_thread(run, faults[i])
        await pub.publish(
            {"class": "deploy", "i": i}, payload(i), confidential=bool(i % 2), ack=(i % 10 == 0)
        )
        await asyncio.sleep(0.01)
    await pub.drain(30)
    got: list[tuple[int, bytes, bool]] = []
    while len(got) < count:
        try:
            msg = await sub.get(20)
        except TrellisTimeout:
            break
        assert msg.publisher == "host-pub"
        got.append((msg.seq, msg.payload, msg.confidential))
    with pytest.raises(TrellisTimeout):
        await sub.get(2.0)  # nothing more: each publication exactly once
    return got


def brokers_said(overlay: ComposeOverlay, more: dict[str, str] | None = None) -> str:
    """The lines of every broker's log (and of ``more``: broker id -> log text) that say
    why a publication went missing: abandoned, blamed, refused, warnings and errors."""
    logs = {b: overlay.logs(b.replace(".", "-")) for b in sorted(overlay.client_ports)}
    logs.update(more or {})
    said = [
        f"{b}: {line}"
        for b, text in logs.items()
        for line in text.splitlines()
        if any(word in line for word in ("abandon", "blame", "refus", "WARNING", "ERROR"))
    ]
    return "\n".join(said[-60:])


def expect_stream(
    overlay: ComposeOverlay, got: list[tuple[int, bytes, bool]], first: int, count: int
) -> None:
    """Assert ``got`` is :func:`stream`'s ``count`` publications from ``first``, exactly,
    saying on a mismatch which seqs are missing and what the brokers said."""
    want = [(i + 1, payload(i), bool(i % 2)) for i in range(first, first + count)]
    if got != want:
        missing = sorted({w[0] for w in want} - {g[0] for g in got})
        print(f"missing seqs {missing}; brokers said:\n{brokers_said(overlay)}")
    assert got == want


async def wait_links(
    overlay: ComposeOverlay, want: dict[str, set[str]], timeout: float = 20
) -> dict[str, set[str]]:
    deadline = time.monotonic() + timeout
    while True:
        links = {}
        for broker in want:
            health = await asyncio.to_thread(overlay.health, broker)
            links[broker] = set(health["links"])  # type: ignore[call-overload]
        if links == want or time.monotonic() > deadline:
            return links
        await asyncio.sleep(0.5)


async def test_traffic_from_the_host_survives_a_killed_and_a_cut_off_replica(
    overlay: ComposeOverlay,
) -> None:
    """Plain and confidential publications at VN b0 reach a subscriber at VN b2 exactly
    once, in order, with their payloads, while b1-1 is killed and b2-2 is disconnected
    from the network mid-stream; once b2-2 is reconnected it is linked again and traffic
    still arrives exactly once."""
    count, after = 240, 60
    network = f"{overlay.project}_trellis"
    killed, cut = overlay.container("b1-1"), overlay.container("b2-2")
    faults = {
        count // 3: [overlay.docker, "kill", killed],
        2 * count // 3: [overlay.docker, "network", "disconnect", network, cut],
    }
    started = time.monotonic()
    async with (
        Client(overlay.endpoints("b0"), client_id="host-pub", **overlay.tls) as pub,
        Client(
            overlay.endpoints("b2"), client_id="host-sub", manifest=overlay.manifest, **overlay.tls
        ) as sc,
        sc.subscribe("class = 'deploy'") as sub,
    ):
        await pub.advertise("class = 'deploy'")
        await asyncio.sleep(1.0)  # routing state settles across the three VNs
        got = await stream(pub, sub, 0, count, faults)
        print(f"{count} publications through the faults in {time.monotonic() - started:.1f} s")
        expect_stream(overlay, got, 0, count)

        # The faults were real: the killed replica stays down (a manual kill is not
        # restarted) and the brokers dropped their links to both replicas.
        inspected = await asyncio.to_thread(run, [overlay.docker, "inspect", killed])
        state = json.loads(inspected)[0]["State"]
        assert not state["Running"]
        b1_links = {"b0.0", "b0.1", "b0.2", "b2.0", "b2.1"}
        want = {"b0.0": {"b1.0", "b1.2"}, "b1.0": b1_links}
        assert await wait_links(overlay, want) == want

        # Reconnected, the cut-off replica is linked again and the stream goes on.
        await asyncio.to_thread(run, [overlay.docker, "network", "connect", network, cut])
        want = {"b1.0": b1_links | {"b2.2"}, "b2.2": {"b1.0", "b1.2"}}
        assert await wait_links(overlay, want) == want
        got = await stream(pub, sub, count, after, {})
        expect_stream(overlay, got, count, after)
    print(f"whole exchange in {time.monotonic() - started:.1f} s")
