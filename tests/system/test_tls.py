"""TLS with real broker processes: who is refused, with which words, and that traffic over
a TLS overlay arrives exactly as published."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from broker.client import Client
from broker.errors import ConnectionLost, TLSError
from broker.tools.launcher import BrokerProcess
from broker.tools.local import ClientTLS, LocalOverlay, fetch_json, start_overlay
from overlay.tree import line_tree
from security.ca import CertificateAuthority, create_ca, issue, save_ca, write_issued
from tests.support import drain, exact_exchange, trellis


def _pki(directory: Path, *names: tuple[str, str]) -> CertificateAuthority:
    """A CA in ``directory`` and a certificate for each (name, role)."""
    ca = create_ca(f"CA {directory.name}")
    save_ca(ca, directory)
    for name, role in names:
        write_issued(issue(ca, name, role), ca, directory, name)  # type: ignore[arg-type]
    return ca


def _tls(directory: Path, name: str) -> dict[str, str]:
    return {
        "tls_ca": str(directory / "ca.crt"),
        "tls_cert": str(directory / f"{name}.crt"),
        "tls_key": str(directory / f"{name}.key"),
    }


def _client(directory: Path, name: str | None) -> ClientTLS:
    args: ClientTLS = {"ca": directory / "ca.crt"}
    if name is not None:
        args["cert"], args["key"] = directory / f"{name}.crt", directory / f"{name}.key"
    return args


def _wait_for_log(proc: BrokerProcess, text: str, timeout: float = 10.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in proc.log_path.read_text(errors="replace").splitlines():
            if text in line:
                return line
        time.sleep(0.1)
    raise AssertionError(f"no log line with {text!r} in {proc.log_path}")


@pytest.fixture
def pki(tmp_path: Path) -> tuple[Path, Path]:
    """Our CA (broker b1, clients alice) and another CA (broker b1, client mallory)."""
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    _pki(ours, ("b1", "broker"), ("alice", "client"))
    _pki(theirs, ("b1", "broker"), ("mallory", "client"))
    return ours, theirs


async def test_clients_without_a_valid_certificate_are_refused_and_others_served(
    run_broker: Callable[..., BrokerProcess], pki: tuple[Path, Path]
) -> None:
    ours, theirs = pki
    broker = run_broker("b1", **_tls(ours, "b1"))
    endpoint = broker.endpoint

    with pytest.raises(TLSError, match="requires a client certificate") as no_cert:
        async with Client(endpoint, connect_timeout=5, **_client(ours, None)):
            pass
    assert "presented none" in no_cert.value.message

    foreign = _client(theirs, "mallory")
    foreign["ca"] = ours / "ca.crt"
    with pytest.raises(TLSError, match="refused this client's certificate"):
        async with Client(endpoint, connect_timeout=5, **foreign):
            pass
    line = _wait_for_log(broker, "TLS handshake with")
    assert "certificate not issued by the project CA" in line

    with pytest.raises(TLSError, match="certificate not issued by the project CA") as wrong_ca:
        async with Client(endpoint, connect_timeout=5, ca=theirs / "ca.crt"):
            pass
    assert wrong_ca.value.endpoint == ""  # aggregated over endpoints by connect()

    with pytest.raises((ConnectionLost, TimeoutError), match="needs ca="):
        async with Client(endpoint, connect_timeout=2):
            pass

    # Everyone else is still served, over TLS.
    async with (
        Client(endpoint, **_client(ours, "alice")) as sub_client,
        Client(endpoint, **_client(ours, "alice")) as pub,
        sub_client.subscribe("class = 't'") as sub,
    ):
        await pub.advertise("class = 't'")
        for i in range(3):
            await pub.publish({"class": "t", "i": i}, b"over tls %d" % i)
        got = await drain(sub)
    assert [m.payload for m in got] == [b"over tls %d" % i for i in range(3)]
    assert broker.alive()


async def test_optional_client_certificates_admit_a_client_with_the_ca_only(
    run_broker: Callable[..., BrokerProcess], pki: tuple[Path, Path]
) -> None:
    ours, _ = pki
    broker = run_broker("b1", tls_client_cert="optional", **_tls(ours, "b1"))
    async with Client(broker.endpoint, ca=ours / "ca.crt") as client:
        await client.flush()


def test_brokers_with_a_certificate_of_another_ca_or_name_are_refused_as_peers(
    run_broker: Callable[..., BrokerProcess], tmp_path: Path
) -> None:
    """``m`` accepts ``a`` (another CA's certificate for 'a') and dials ``z`` (our CA's
    certificate, but for broker 'y'): neither link comes up, each refusal is logged with
    its cause, and ``m`` keeps serving its clients."""
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    _pki(ours, ("m", "broker"), ("y", "broker"), ("alice", "client"))
    _pki(theirs, ("a", "broker"))
    z = run_broker("z", **_tls(ours, "y"))
    m = run_broker(
        "m",
        admin_port=0,
        # m accepts only configured neighbours: a is one, so its refusal is TLS's.
        neighbours=[{"id": "z", "endpoint": z.endpoint}, {"id": "a", "endpoint": "127.0.0.1:1"}],
        **_tls(ours, "m"),
    )
    # a knows our CA's certificate (it is public) but holds a certificate of its own CA.
    foreign = {**_tls(theirs, "a"), "tls_ca": str(ours / "ca.crt")}
    a = run_broker("a", neighbours=[{"id": "m", "endpoint": m.endpoint}], **foreign)
    assert a.alive()
    accept = _wait_for_log(m, "TLS handshake with")
    assert "certificate not issued by the project CA" in accept
    dial = _wait_for_log(m, "cannot link m-z")
    assert "presented the certificate of broker 'y'" in dial
    assert fetch_json(m.admin_url + "/healthz")["links"] == []

    async def served() -> bytes:
        async with Client(m.endpoint, **_client(ours, "alice")) as c, c.subscribe("k = 1") as sub:
            await c.advertise("k = 1")
            await c.publish({"k": 1}, b"still here")
            return (await sub.get(5)).payload

    assert asyncio.run(served()) == b"still here"


@pytest.fixture
def tls_overlay(tmp_path: Path) -> Iterator[Callable[..., LocalOverlay]]:
    started: list[LocalOverlay] = []

    def _run(**kwargs: Any) -> LocalOverlay:
        overlay = start_overlay(tmp_path / f"tls{len(started)}", tls=True, **kwargs)
        started.append(overlay)
        return overlay

    yield _run
    for overlay in started:
        overlay.stop()


@pytest.mark.slow
async def test_replicated_overlay_over_tls_delivers_plain_and_confidential_exactly(
    tls_overlay: Callable[..., LocalOverlay],
) -> None:
    overlay = tls_overlay(tree=line_tree(["b0", "b1"]), replicas={"b0": 3, "b1": 3})
    for broker in overlay.brokers.values():
        assert "(TLS)" in broker.log_path.read_text()
    exchange = await exact_exchange(overlay, "tls-pub", 40, plain_every=2, rate=100)
    assert exchange.faults() == {"altered": 0, "lost": 0, "duplicated": 0, "reordered": 0}
    assert sorted(exchange.received) == sorted(exchange.sent)
    assert exchange.blamed == {}
    # A broker restarted in place comes back with its certificate and relinks.
    overlay.brokers["b1.2"].kill()
    overlay.start("b1.2")
    overlay.wait_linked()


def cli_exchange(
    tmp_path: Path, sub_args: list[str], pub_args: list[str], word: str
) -> tuple[list[str], str]:
    """``trellis sub SUB_ARGS`` waiting for three deliveries while ``trellis pub PUB_ARGS``
    publishes ``word`` plain, confidential, and confidential with its key shares by the
    pass: the payloads it printed, and its stderr."""
    ready = tmp_path / "sub.ready"
    sub = subprocess.Popen(
        [sys.executable, "-m", "broker", "sub", "class = 'cli'", *sub_args,
         "--count", "3", "--timeout", "20", "--ready-file", str(ready)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 20
        while not ready.exists() and time.monotonic() < deadline and sub.poll() is None:
            time.sleep(0.05)
        assert ready.exists(), sub.stderr.read() if sub.stderr else ""
        for flags in ([], ["--confidential"], ["--confidential", "--share-form", "pass"]):
            pub = trellis(
                "pub", *pub_args, "--attrs", "class='cli'",
                "--payload", " ".join([word, *flags]), *flags,
            )  # fmt: skip
            assert pub.returncode == 0, pub.stderr
        out, err = sub.communicate(timeout=30)
    finally:
        if sub.poll() is None:
            sub.kill()
            sub.wait()
    assert sub.returncode == 0, err
    return [line.split(" ", 2)[2] for line in out.splitlines()], err


@pytest.mark.slow
def test_cli_pub_and_sub_speak_tls_to_an_overlay_started_with_tls(tmp_path: Path) -> None:
    directory = tmp_path / "ov"
    up = trellis("up", "--tls", "--vns", "2", "--dir", str(directory))
    try:
        assert up.returncode == 0, up.stderr
        tls = ["--ca", str(directory / "tls/ca.crt")]
        tls += ["--cert", str(directory / "tls/client.crt")]
        tls += ["--key", str(directory / "tls/client.key")]
        info = json.loads((directory / "overlay.json").read_text())
        assert info["tls"]["ca"] == str(directory / "tls/ca.crt")
        endpoints = {b["id"]: b["endpoint"] for b in info["brokers"]}
        manifest = ["--manifest", str(directory / "manifest.json")]
        got, _ = cli_exchange(
            tmp_path,
            ["--endpoint", endpoints["b1"], *manifest, *tls],
            ["--endpoint", endpoints["b0"], *tls],
            "tls",
        )
        assert got == ["tls", "tls --confidential", "tls --confidential --share-form pass"]

        refused = trellis("pub", "--endpoint", endpoints["b0"], "--attrs", "class='cli'", *tls[:2])
        assert refused.returncode == 2
        assert "requires a client certificate" in refused.stderr
        half = trellis("sub", "*", "--endpoint", endpoints["b0"], "--cert", "x.crt")
        assert half.returncode == 2
        assert half.stderr.strip().splitlines()[-1] == (
            "trellis sub: error: --cert and --key go together (a certificate and its private key)"
        )
    finally:
        trellis("down", "--dir", str(directory))


@pytest.mark.slow
def test_cli_pub_and_sub_find_a_vn_of_a_local_overlay_by_dir_and_vn(tmp_path: Path) -> None:
    """``--dir DIR --vn VN``: every replica's endpoint, the client certificate of a ``--tls``
    overlay and (for ``sub``) the manifest come from the overlay's directory."""
    directory = tmp_path / "ov"
    up = trellis("up", "--tls", "--vns", "2", "--replicas", "3", "--dir", str(directory))
    try:
        assert up.returncode == 0, up.stderr
        at = ["--dir", str(directory), "--vn"]
        got, err = cli_exchange(tmp_path, [*at, "b1"], [*at, "b0"], "dir")
        assert "at VN b1 of" in err
        assert got == ["dir", "dir --confidential", "dir --confidential --share-form pass"]
    finally:
        trellis("down", "--dir", str(directory))
