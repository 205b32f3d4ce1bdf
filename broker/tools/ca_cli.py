"""``trellis ca init`` and ``trellis ca issue``: the project CA on the command line.

``init`` writes a CA (``ca.crt``, and ``ca.key`` readable by its owner only) into a
directory; ``issue`` signs a certificate for a named broker or client with it and writes
``NAME.crt``, ``NAME.key`` and a copy of ``ca.crt`` into ``--out``: the three files a
broker's ``tls_*`` settings or a client's ``--ca/--cert/--key`` name.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from urllib.parse import quote

__all__ = ["add_ca_parser"]


def cmd_ca_init(args: argparse.Namespace) -> int:
    from security.ca import create_ca, save_ca

    ca = create_ca(args.name, days=args.days, key_type=args.key_type)
    path = save_ca(ca, Path(args.dir), force=args.force)
    print(f"CA '{args.name}' written: {path} (certificate), {Path(args.dir) / 'ca.key'} (key)")
    return 0


def cmd_ca_issue(args: argparse.Namespace) -> int:
    from cryptography import x509

    from security.ca import Role, issue, load_ca, load_private_key, write_issued

    ca = load_ca(Path(args.ca))
    if not args.force:
        _refuse_to_replace(Path(args.out), args.name)
    key = load_private_key(Path(args.key)) if args.key else None
    role: Role = "client" if args.client else "tdn" if args.tdn else "broker"
    issued = issue(
        ca, args.name, role, sans=args.san, key=key, key_type=args.key_type, days=args.days
    )
    cert_path, key_path = write_issued(issued, ca, Path(args.out), args.name)
    sans = issued.cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    names = [str(name.value) for name in sans]
    print(f"{role} certificate for '{args.name}': {cert_path}, key {key_path}")
    print(f"  names: {' '.join(names)}; valid until {issued.cert.not_valid_after_utc:%Y-%m-%d}")
    return 0


def _refuse_to_replace(out: Path, name: str) -> None:
    """Refuse to write over NAME's certificate or key in ``out`` (as ``write_issued``
    names them): the key they replace would be gone for good."""
    stem = quote(name, safe="")
    held = [p.name for p in (out / f"{stem}.crt", out / f"{stem}.key") if p.exists()]
    if held:
        raise ValueError(
            f"{out} already holds {' and '.join(held)} for {name!r}; refusing to overwrite "
            f"(--force replaces them)"
        )


def _days(text: str) -> int:
    try:
        days = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number of days, got {text!r}") from None
    if days <= 0:
        raise argparse.ArgumentTypeError(f"must be greater than 0, got {text!r}")
    return days


def add_ca_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``trellis ca init|issue``."""
    p = sub.add_parser("ca", help="the project CA: create it, issue broker and client certificates")
    verbs = p.add_subparsers(
        dest="verb",
        required=True,
        metavar="VERB",
        help="init: create a CA; issue: a certificate for a broker or a client",
    )

    init = verbs.add_parser("init", help="create a CA in a directory (ca.crt, ca.key)")
    init.add_argument("--dir", required=True, help="where ca.crt and ca.key go")
    init.add_argument(
        "--name", default="Trellis project CA", help="the CA's name (default: %(default)s)"
    )
    init.add_argument("--days", type=_days, default=3650, help="validity (default: %(default)s)")
    init.add_argument(
        "--key-type",
        choices=["ed25519", "ecdsa"],
        default="ed25519",
        help="the CA key's kind (default: %(default)s)",
    )
    init.add_argument(
        "--force", action="store_true", help="overwrite a CA already in --dir (default: refuse)"
    )
    init.set_defaults(func=cmd_ca_init)

    iss = verbs.add_parser("issue", help="issue a certificate for a broker or a client")
    iss.add_argument("--ca", required=True, help="the CA's directory (trellis ca init --dir)")
    iss.add_argument("--name", required=True, help="the broker id or client id it proves")
    role = iss.add_mutually_exclusive_group()
    role.add_argument("--broker", action="store_true", help="a broker certificate (the default)")
    role.add_argument("--client", action="store_true", help="a client certificate")
    role.add_argument(
        "--tdn", action="store_true", help="a topic discovery node's certificate (trellis tdn)"
    )
    iss.add_argument(
        "--san",
        action="append",
        default=[],
        metavar="NAME_OR_IP",
        help="a DNS name or IP address clients dial the broker by (repeatable; default for "
        "a broker: localhost, 127.0.0.1, ::1; its id is added when it is a DNS name)",
    )
    iss.add_argument(
        "--key",
        help="certify this private key (PEM, or a broker's hex key_file) instead of a new one",
    )
    iss.add_argument(
        "--key-type",
        choices=["ed25519", "ecdsa"],
        default="ed25519",
        help="the kind of a new key (default: %(default)s)",
    )
    iss.add_argument("--days", type=_days, default=825, help="validity (default: %(default)s)")
    iss.add_argument("--out", required=True, help="where NAME.crt, NAME.key and ca.crt go")
    iss.add_argument(
        "--force",
        action="store_true",
        help="overwrite NAME.crt and NAME.key already in --out (default: refuse)",
    )
    iss.set_defaults(func=cmd_ca_issue)
