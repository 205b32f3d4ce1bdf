"""The ``trellis tdn`` parser, kept apart from :mod:`broker.tools.tdn` because ``trellis``
builds every command's parser for every command: this module must not load the SDK or the
cryptography (``trellis broker`` starts once per broker process)."""

from __future__ import annotations

import argparse

__all__ = ["add_tdn_parser"]


def add_tdn_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``trellis tdn --config FILE``."""
    p = subparsers.add_parser("tdn", help="run a topic discovery node (an overlay client)")
    p.add_argument("--config", required=True, help="TOML file with a [tdn] table")
    p.add_argument(
        "--new-identity",
        metavar="ID",
        help="write a fresh identity with this id to the config's identity file (refused "
        "if it exists), print the trusted-TDNs entry, and exit",
    )
    p.add_argument("--ready-file", help="written once the TDN serves (default: none)")
    p.add_argument(
        "--log-level",
        choices=["debug", "info", "warning", "error"],
        default="info",
        help="(default: %(default)s)",
    )
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from broker.tools.tdn import cmd_tdn

    return cmd_tdn(args)
