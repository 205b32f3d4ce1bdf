"""``trellis ca init|issue`` as a user runs them: files written, one-line errors, exit 2."""

from __future__ import annotations

from pathlib import Path

from cryptography import x509

from security.ca import Identity, identity_of, verify_issued
from security.envelope import generate_signing_key, private_key_to_bytes, public_key_to_bytes
from tests.support import trellis


def test_init_then_issue_writes_a_certificate_the_ca_signed(tmp_path: Path) -> None:
    ca_dir, out = tmp_path / "ca", tmp_path / "out"
    assert trellis("ca", "init", "--dir", str(ca_dir)).returncode == 0
    key = generate_signing_key()
    (tmp_path / "b1.key").write_text(private_key_to_bytes(key).hex() + "\n")
    made = trellis(
        "ca", "issue", "--ca", str(ca_dir), "--name", "b1", "--broker", "--san", "10.1.2.3",
        "--key", str(tmp_path / "b1.key"), "--out", str(out),
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    assert "urn:trellis:broker:b1 b1 10.1.2.3" in made.stdout
    cert = x509.load_pem_x509_certificate((out / "b1.crt").read_bytes())
    ca_cert = x509.load_pem_x509_certificate((out / "ca.crt").read_bytes())
    assert verify_issued(ca_cert, cert)
    assert identity_of(cert) == Identity("broker", "b1")
    assert cert.public_key().public_bytes_raw() == public_key_to_bytes(key.public_key())  # type: ignore[union-attr]
    assert (out / "b1.key").stat().st_mode & 0o077 == 0


def test_ca_mistakes_are_one_line_errors_with_exit_2(tmp_path: Path) -> None:
    ca_dir = tmp_path / "ca"
    trellis("ca", "init", "--dir", str(ca_dir))
    cases = {
        ("ca", "init", "--dir", str(ca_dir)): "already holds a CA",
        ("ca", "issue", "--ca", str(tmp_path / "none"), "--name", "x", "--out", str(tmp_path)):
            "ca.crt is missing",
        ("ca", "issue", "--ca", str(ca_dir), "--name", "x", "--san", "a b", "--out", str(tmp_path)):
            "neither an IP address nor a DNS name",
    }  # fmt: skip
    for args, words in cases.items():
        result = trellis(*args)
        assert result.returncode == 2, args
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1, result.stderr
        assert lines[0].startswith("trellis ca: error: ")
        assert words in lines[0]
