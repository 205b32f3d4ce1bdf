"""The project CA: certificates that carry identities, verify against their CA only, and
work for TLS in Python's ssl (Ed25519 and ECDSA) over real sockets."""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path

import pytest
from cryptography import x509
from hypothesis import given
from hypothesis import strategies as st

from security.ca import (
    Identity,
    create_ca,
    identity_from_sans,
    identity_of,
    identity_uri,
    issue,
    load_ca,
    load_private_key,
    save_ca,
    verify_issued,
    write_issued,
)
from security.envelope import generate_signing_key, private_key_to_bytes, public_key_to_bytes
from security.errors import InvalidRequest
from security.tls import client_context, peer_identity, server_context


def _sans(cert: x509.Certificate) -> list[str]:
    ext = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return [str(name.value) for name in ext]


def test_broker_certificate_names_its_id_and_loopback_by_default() -> None:
    ca = create_ca()
    issued = issue(ca, "b1", "broker")
    assert issued.identity == Identity("broker", "b1")
    assert _sans(issued.cert) == ["urn:trellis:broker:b1", "b1", "localhost", "127.0.0.1", "::1"]
    usage = issued.cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert {u._name for u in usage} == {"serverAuth", "clientAuth"}


def test_explicit_sans_replace_the_loopback_defaults() -> None:
    issued = issue(create_ca(), "b1", "broker", sans=["b1.example", "10.0.0.7"])
    assert _sans(issued.cert) == ["urn:trellis:broker:b1", "b1", "b1.example", "10.0.0.7"]


def test_client_certificate_cannot_serve_and_carries_a_client_identity() -> None:
    issued = issue(create_ca(), "alice", "client")
    assert issued.identity == Identity("client", "alice")
    usage = issued.cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert [u._name for u in usage] == ["clientAuth"]


def test_a_certificate_verifies_against_its_own_ca_only() -> None:
    ours, theirs = create_ca(), create_ca()
    issued = issue(ours, "b1", "broker")
    assert verify_issued(ours.cert, issued.cert)
    assert not verify_issued(theirs.cert, issued.cert)


def test_an_existing_manifest_key_is_certified_as_is(tmp_path: Path) -> None:
    key = generate_signing_key()
    path = tmp_path / "b1.key"
    path.write_text(private_key_to_bytes(key).hex() + "\n")
    issued = issue(create_ca(), "b1", "broker", key=load_private_key(path))
    assert issued.cert.public_key() == key.public_key()
    raw = issued.cert.public_key().public_bytes_raw()  # type: ignore[union-attr]
    assert raw == public_key_to_bytes(key.public_key())


@pytest.mark.parametrize("bad", ["bad name", "-x", "a..b", ""])
def test_a_san_that_is_neither_a_name_nor_an_address_is_refused(bad: str) -> None:
    with pytest.raises(InvalidRequest, match="neither an IP address nor a DNS name"):
        issue(create_ca(), "b1", "broker", sans=[bad])


def test_saved_ca_loads_back_and_is_never_overwritten(tmp_path: Path) -> None:
    ca = create_ca("test CA")
    save_ca(ca, tmp_path)
    assert (tmp_path / "ca.key").stat().st_mode & 0o077 == 0
    loaded = load_ca(tmp_path)
    assert loaded.cert == ca.cert
    with pytest.raises(InvalidRequest, match="already holds a CA"):
        save_ca(create_ca(), tmp_path)
    with pytest.raises(InvalidRequest, match=r"ca\.crt is missing"):
        load_ca(tmp_path / "nowhere")


def test_identities_of_other_cas_are_not_recognised() -> None:
    assert identity_from_sans([("DNS", "b1"), ("URI", "https://example.org/b1")]) is None
    assert identity_from_sans([("URI", "urn:trellis:admin:b1")]) is None
    assert peer_identity({}) is None
    assert peer_identity(None) is None


_NAMES = st.text(st.characters(exclude_categories=["Cs"]), min_size=1)


@given(_NAMES.filter(lambda s: s == s.strip()), st.sampled_from(["broker", "client"]))
def test_any_name_round_trips_through_its_uri(name: str, role: str) -> None:
    uri = identity_uri(role, name)  # type: ignore[arg-type]
    assert identity_from_sans([("URI", uri)]) == Identity(role, name)  # type: ignore[arg-type]


def test_identity_survives_in_the_certificate_for_names_with_separators() -> None:
    issued = issue(create_ca(), "vn:a/b 1", "client")
    assert identity_of(issued.cert) == Identity("client", "vn:a/b 1")


async def _handshake(tmp_path: Path, key_type: str) -> tuple[Identity | None, bytes]:
    ca = create_ca(key_type=key_type)  # type: ignore[arg-type]
    save_ca(ca, tmp_path / "ca")
    write_issued(issue(ca, "b1", "broker", key_type=key_type), ca, tmp_path, "b1")  # type: ignore[arg-type]
    write_issued(issue(ca, "c1", "client", key_type=key_type), ca, tmp_path, "c1")  # type: ignore[arg-type]
    seen: list[Identity | None] = []

    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append(peer_identity(writer.get_extra_info("peercert")))
        writer.write(await reader.readexactly(4))
        await writer.drain()
        writer.close()

    server_ctx = server_context(tmp_path / "ca.crt", tmp_path / "b1.crt", tmp_path / "b1.key")
    server = await asyncio.start_server(echo, "127.0.0.1", 0, ssl=server_ctx)
    port = server.sockets[0].getsockname()[1]
    ctx = client_context(tmp_path / "ca.crt", tmp_path / "c1.crt", tmp_path / "c1.key")
    async with server, asyncio.timeout(10):
        reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=ctx)
        writer.write(b"ping")
        got = await reader.readexactly(4)
        cipher = writer.get_extra_info("ssl_object").version()
        writer.close()
    assert cipher in ("TLSv1.3", "TLSv1.2")
    return seen[0], got


@pytest.mark.parametrize("key_type", ["ed25519", "ecdsa"])
async def test_issued_certificates_complete_a_mutual_tls_handshake(
    tmp_path: Path, key_type: str
) -> None:
    identity, echoed = await _handshake(tmp_path, key_type)
    assert identity == Identity("client", "c1")
    assert echoed == b"ping"


def test_a_client_trusting_another_ca_refuses_the_broker(tmp_path: Path) -> None:
    ours, theirs = create_ca(), create_ca()
    save_ca(theirs, tmp_path / "theirs")
    write_issued(issue(ours, "b1", "broker"), ours, tmp_path / "ours", "b1")
    server_ctx = server_context(
        tmp_path / "ours/ca.crt", tmp_path / "ours/b1.crt", tmp_path / "ours/b1.key"
    )
    client_ctx = client_context(tmp_path / "theirs/ca.crt")

    async def attempt() -> None:
        server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0, ssl=server_ctx)
        port = server.sockets[0].getsockname()[1]
        async with server, asyncio.timeout(10):
            await asyncio.open_connection("127.0.0.1", port, ssl=client_ctx)

    with pytest.raises(ssl.SSLCertVerificationError):
        asyncio.run(attempt())
