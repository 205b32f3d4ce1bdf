"""The ``--ca``/``--cert``/``--key`` options of every command that connects to brokers as a
client (``pub``, ``sub``, ``bridge mqtt``), in a module of their own so that commands defined
outside ``broker.tools.cli`` take them without importing it back."""

from __future__ import annotations

import argparse

__all__ = ["add_tls_arguments"]


def add_tls_arguments(parser: argparse.ArgumentParser) -> None:
    """``--ca``, ``--cert``, ``--key``: TLS for a command that connects to brokers."""
    parser.add_argument(
        "--ca", help="the project CA's certificate (ca.crt): connect over TLS (default: plaintext)"
    )
    parser.add_argument(
        "--cert", help="this client's certificate (trellis ca issue --client), with --key"
    )
    parser.add_argument("--key", help="the private key of --cert")
