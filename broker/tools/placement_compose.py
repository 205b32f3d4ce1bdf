"""Live replica attach and detach in the compose deployment (``trellis placement apply
--compose FILE``, SPEC §4).

The manifest steps are :class:`broker.tools.placement_apply.Replicas`'; this module says
how a replica of the compose deployment (``deploy/compose_gen.py``, ``docker-compose.yml``)
gets its identity, starts and stops:

* its signing key goes into the keys dir (``compose_gen.py keys``) beside the others, with a
  certificate from the deployment's CA (``ca/``) in ``tls/``;
* its broker TOML (a running sibling's, with its own id, slot and the current replicas of the
  VNs its sibling links to) goes into ``placement/`` under the keys dir;
* its service goes into ``docker-compose.placement.yml`` in the keys dir, an override file
  passed after the deployment's own compose file to every ``docker-compose`` call made here
  (JSON, which is YAML; its host ports are ephemeral, on 127.0.0.1); ``docker-compose up -d
  --no-deps SERVICE`` starts that one container and touches no other;
* a detach runs ``docker-compose stop`` (SIGTERM: the broker routes what it received and
  flushes its links), removes the container and its anonymous volume, and drops the service
  from the override file (a service of the deployment's own file is marked with the profile
  ``detached`` there instead, so a later ``docker-compose up -d`` leaves it down).

The operator host reaches every broker on the ports the containers publish on 127.0.0.1 (read
with ``docker inspect``, so ``TRELLIS_PORT_*`` overrides need not be known); control
connections are under each broker's own id, over TLS with its certificate from ``tls/``.

The containers see the manifest through a single-file bind mount, which keeps the inode it
was mounted with: a manifest written by rename (:meth:`Manifest.save`) would never reach them.
Here it is rewritten in place; brokers read it only when told to adopt it, and a client that
reads it half-written keeps the one in force and reads it again on its next change.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from broker.tools.launcher import write_config
from broker.tools.local import OverlayError, fetch_json
from broker.tools.placement_apply import BrokerAccess, Replicas, new_key_file, with_members
from overlay.manifest import Manifest

CLIENT_PORT = 7700
"""Every broker's client/broker port inside its container."""
ADMIN_PORT = 9100
"""Every broker's admin port inside its container."""
IMAGE_UID = 10001
"""The broker image's user (deploy/Dockerfile)."""
CA_DIR = "ca"
"""Under the keys dir: the CA's certificate and key (never mounted)."""
TLS_DIR = "tls"
"""Under the keys dir: ca.crt, each broker's and the host client's certificate and key."""
TLS_MOUNT = "/etc/trellis/tls"
"""Where a broker container finds its certificate, key and ca.crt."""
CONFIG_MOUNT = "/etc/trellis/broker.toml"
OVERRIDE_FILE = "docker-compose.placement.yml"
"""Under the keys dir: the services placement attached (and base services it detached)."""
CONFIGS_DIR = "placement"
"""Under the keys dir: the broker TOMLs of attached replicas."""
DETACHED_PROFILE = "detached"
COMPOSE_TIMEOUT = 120.0
STOP_GRACE = 10
READY_TIMEOUT = 30.0
"""Seconds a new container's broker has to answer (image start, Python imports)."""
"""Seconds ``docker-compose stop`` gives a leaving broker to flush before SIGKILL."""


def service(broker_id: str) -> str:
    """The compose service (and DNS name) of a broker: ``b1.2`` runs as ``b1-2``."""
    return broker_id.replace(".", "-")


def readable_by_image(path: Path) -> None:
    """Let the broker image's user read a key mounted into its container: run as root, the
    key becomes that user's (mode 0600); otherwise readable by all (a local demo only)."""
    if os.geteuid() == 0:
        os.chown(path, IMAGE_UID, IMAGE_UID)
        path.chmod(0o600)
    else:
        path.chmod(0o644)


def docker_client() -> str:
    """Debian's client first: another ``docker`` earlier on PATH may misbehave."""
    if os.access("/usr/bin/docker", os.X_OK):
        return "/usr/bin/docker"
    found = shutil.which("docker")
    if found is None:
        raise OverlayError("no docker client (bash deploy/setup.sh installs one)")
    return found


def default_project(compose_file: Path, env: Mapping[str, str]) -> str:
    """The project name docker-compose would use: ``COMPOSE_PROJECT_NAME`` or the compose
    file's directory name, lower case, without the characters compose drops."""
    name = env.get("COMPOSE_PROJECT_NAME") or compose_file.resolve().parent.name
    return re.sub(r"[^-_a-z0-9]", "", name.lower())


def is_compose_keys_dir(directory: Path) -> bool:
    """Whether ``directory`` looks like a compose deployment's keys dir (``compose_gen.py
    keys``): a manifest, a CA and certificates, and no ``overlay.json`` of ``trellis up``."""
    return (
        (directory / "manifest.json").is_file()
        and (directory / CA_DIR).is_dir()
        and (directory / TLS_DIR / "ca.crt").is_file()
        and not (directory / "overlay.json").exists()
    )


def host_port(container: Mapping[str, Any], port: int) -> int:
    """The 127.0.0.1 port a container publishes its ``port`` on (``docker inspect``)."""
    bindings = (container["NetworkSettings"].get("Ports") or {}).get(f"{port}/tcp") or []
    for binding in bindings:
        if binding.get("HostIp") in ("127.0.0.1", "0.0.0.0", ""):
            return int(binding["HostPort"])
    raise OverlayError(f"container {container['Name']} publishes no port for {port}")


class ComposeReplicas(Replicas):
    """Attach and detach replicas of a running compose deployment.

    ``keys_dir``: the deployment's keys dir (``compose_gen.py keys --dir``, the compose file's
    ``TRELLIS_KEYS_DIR``); ``compose_file``: its ``docker-compose.yml``; ``project``: its
    compose project (default: as docker-compose derives it); ``env``: the environment its
    ``docker-compose`` calls need (default: this process's)."""

    def __init__(
        self,
        keys_dir: Path,
        compose_file: Path,
        project: str | None = None,
        env: Mapping[str, str] | None = None,
        docker: str | None = None,
    ) -> None:
        self.keys_dir = keys_dir.resolve()
        self.manifest_path = self.keys_dir / "manifest.json"
        if not self.manifest_path.is_file():
            raise OverlayError(f"no compose deployment keys in {keys_dir} (no manifest.json)")
        self.compose_file = compose_file.resolve()
        self.env = dict(os.environ if env is None else env)
        self.project = project or default_project(self.compose_file, self.env)
        self.docker = docker or docker_client()
        self.override = self.keys_dir / OVERRIDE_FILE
        self.configs = self.keys_dir / CONFIGS_DIR
        self.tls_dir = self.keys_dir / TLS_DIR

    # --- docker and docker-compose -------------------------------------------------------

    def _run(self, cmd: list[str], timeout: float = COMPOSE_TIMEOUT) -> str:
        try:
            done = subprocess.run(
                cmd, capture_output=True, text=True, timeout=timeout, env=self.env, check=False
            )
        except subprocess.TimeoutExpired:
            raise OverlayError(f"{' '.join(cmd)} took longer than {timeout:g} s") from None
        if done.returncode != 0:
            raise OverlayError(
                f"{' '.join(cmd)} exited {done.returncode}: {done.stderr.strip()[-2000:]}"
            )
        return done.stdout

    def compose(self, *args: str, timeout: float = COMPOSE_TIMEOUT) -> str:
        """Run ``docker-compose`` on the deployment's file and the placement override."""
        files = ["-f", str(self.compose_file)]
        if self.override.exists():
            files += ["-f", str(self.override)]
        return self._run(["docker-compose", *files, "-p", self.project, *args], timeout)

    def containers(self) -> dict[str, dict[str, Any]]:
        """``docker inspect`` of the project's running broker containers, by broker id."""
        by_service = {service(b): b for b in self.manifest.keys}
        ids = self._run(
            [
                self.docker,
                "ps",
                "-q",
                "--filter",
                f"label=com.docker.compose.project={self.project}",
            ]
        ).split()
        if not ids:
            return {}
        out = {}
        for container in json.loads(self._run([self.docker, "inspect", *ids])):
            name = container["Config"]["Labels"].get("com.docker.compose.service", "")
            if name in by_service and container["State"].get("Running"):
                out[by_service[name]] = container
        return out

    def running(self) -> dict[str, BrokerAccess]:
        from security.tls import link_context

        out = {}
        for broker_id, container in self.containers().items():
            ssl = link_context(
                self.tls_dir / "ca.crt",
                self.tls_dir / f"{broker_id}.crt",
                self.tls_dir / f"{broker_id}.key",
            )
            out[broker_id] = BrokerAccess(
                f"127.0.0.1:{host_port(container, CLIENT_PORT)}",
                f"http://127.0.0.1:{host_port(container, ADMIN_PORT)}",
                {"ssl": ssl},
            )
        return out

    # --- the manifest, identities, configs ------------------------------------------------

    def _write_manifest(self, manifest: Manifest) -> None:
        """In place: the containers' single-file bind mounts keep the file's inode."""
        text = json.dumps(manifest.to_dict(), indent=2) + "\n"
        with self.manifest_path.open("r+", encoding="utf-8") as f:
            f.write(text)
            f.truncate()
            f.flush()
            os.fsync(f.fileno())

    def _identity(self, broker_id: str, fresh: bool) -> bytes | None:
        """A key in the keys dir (kept for a slot that had one) and a certificate from the
        deployment's CA naming the replica's service, ``localhost`` and ``127.0.0.1``."""
        from security.ca import issue, load_ca, load_private_key, write_issued

        key_path = self.keys_dir / f"{broker_id}.key"
        public = new_key_file(key_path) if fresh else None
        ca = load_ca(self.keys_dir / CA_DIR)
        sans = [service(broker_id), "localhost", "127.0.0.1"]
        issued = issue(ca, broker_id, "broker", key=load_private_key(key_path), sans=sans)
        write_issued(issued, ca, self.tls_dir, broker_id)
        for path in (key_path, self.tls_dir / f"{broker_id}.key"):
            readable_by_image(path)
        return public

    def _config_for(
        self, broker_id: str, vn: str, sibling: dict[str, Any], extra: dict[str, Any]
    ) -> dict[str, Any]:
        """A running sibling's TOML (every container has the same paths and ports) with the
        joining replica's id and slot, the current replicas of the VNs the sibling links to
        as neighbours, and its own VN's replicas as peers."""
        mounts = {m["Destination"]: m["Source"] for m in sibling["Mounts"]}
        if CONFIG_MOUNT not in mounts:
            raise OverlayError(f"container {sibling['Name']} mounts no {CONFIG_MOUNT}")
        base = tomllib.loads(Path(mounts[CONFIG_MOUNT]).read_text(encoding="utf-8"))
        manifest = self.manifest
        sibling_id = str(base["id"])
        neighbours = [
            {
                "id": b,
                "endpoint": f"{service(b)}:{CLIENT_PORT}",
                "vn": other,
                "replica": i,
                "vn_size": len(manifest.members[other]),
            }
            for other in self._linked_vns(sibling_id, vn)
            for i, b in enumerate(manifest.members[other])
        ]
        linked = {n["id"] for n in neighbours} | {broker_id}
        config = {
            **base,
            **extra,
            "id": broker_id,
            "neighbours": neighbours,
            "peers": [p for p in base.get("peers", []) if p["id"] not in linked],
        }
        members = [*manifest.members[vn], broker_id]
        return with_members(config, vn, [(b, f"{service(b)}:{CLIENT_PORT}") for b in members])

    def _overrides(self) -> dict[str, Any]:
        if not self.override.exists():
            return {"services": {}}
        data: dict[str, Any] = json.loads(self.override.read_text(encoding="utf-8"))
        return data

    def _save_overrides(self, data: dict[str, Any]) -> None:
        if not data["services"]:
            self.override.unlink(missing_ok=True)
            return
        tmp = self.override.with_name(self.override.name + ".tmp")
        tmp.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
        tmp.replace(self.override)

    def _start(self, broker_id: str, vn: str, index: int, settings: dict[str, Any]) -> str:
        containers = self.containers()
        sibling = next((b for b in self.manifest.members[vn] if b in containers), None)
        if sibling is None:
            raise OverlayError(f"no replica of {vn} runs: nothing to attach to")
        name = service(broker_id)
        self.configs.mkdir(exist_ok=True)
        config_path = self.configs / f"{name}.toml"
        write_config(config_path, self._config_for(broker_id, vn, containers[sibling], settings))
        config_path.chmod(0o644)
        keys = self.keys_dir
        data = self._overrides()
        data["services"][name] = {
            # The sibling's image by id, not by tag: a tag rebuilt since the deployment
            # started (another checkout's images.sh) would run other code beside it.
            "image": containers[sibling]["Image"],
            "restart": "unless-stopped",
            "networks": ["trellis"],
            "hostname": name,
            "ports": [f"127.0.0.1::{CLIENT_PORT}", f"127.0.0.1::{ADMIN_PORT}"],
            "volumes": [
                f"{config_path}:{CONFIG_MOUNT}:ro",
                f"{self.manifest_path}:/etc/trellis/manifest.json:ro",
                f"{keys / broker_id}.key:/etc/trellis/broker.key:ro",
                f"{self.tls_dir}/ca.crt:{TLS_MOUNT}/ca.crt:ro",
                f"{self.tls_dir / broker_id}.crt:{TLS_MOUNT}/broker.crt:ro",
                f"{self.tls_dir / broker_id}.key:{TLS_MOUNT}/broker.key:ro",
                "traffic:/var/lib/trellis/traffic",
            ],
        }
        self._save_overrides(data)
        self.compose("up", "-d", "--no-deps", name)
        self._wait_ready(broker_id)
        return f"{name}:{CLIENT_PORT}"

    def _wait_ready(self, broker_id: str) -> None:
        """Wait until the new container's broker answers on its admin port: its published
        ports accept (and reset) connections before the broker listens."""
        deadline = time.monotonic() + READY_TIMEOUT
        while True:
            broker = self.running().get(broker_id)
            if broker is not None:
                try:
                    fetch_json(broker.admin + "/healthz")
                    return
                except (OSError, ValueError):
                    pass
            if time.monotonic() > deadline:
                raise OverlayError(
                    f"{broker_id}'s container did not answer within {READY_TIMEOUT:g} s "
                    f"(docker logs of service {service(broker_id)} say why)"
                )
            time.sleep(0.1)

    def _stop(self, broker_id: str) -> None:
        name = service(broker_id)
        self.compose("stop", "-t", str(STOP_GRACE), name, timeout=STOP_GRACE + COMPOSE_TIMEOUT)
        self.compose("rm", "-f", "-v", name)
        data = self._overrides()
        base_file = ["-f", str(self.compose_file), "-p", self.project]
        base = self._run(["docker-compose", *base_file, "config", "--services"]).split()
        if name in base:
            data["services"][name] = {"profiles": [DETACHED_PROFILE]}
        else:
            data["services"].pop(name, None)
        (self.configs / f"{name}.toml").unlink(missing_ok=True)
        self._save_overrides(data)

    def _record(self, vn: str, members: Sequence[str]) -> None:
        """Rewrite (in place: bind-mounted) the TOMLs of the replicas placement attached.
        The deployment's own TOMLs (``deploy/compose/*.toml``, generated and committed) are
        left as generated."""
        endpoints = [(b, f"{service(b)}:{CLIENT_PORT}") for b in members]
        for path in sorted(self.configs.glob("*.toml")) if self.configs.is_dir() else []:
            config = tomllib.loads(path.read_text(encoding="utf-8"))
            updated = with_members(config, vn, endpoints)
            if updated != config:
                write_config(path, updated)
