"""``trellis topic ...`` and the ``--identity``/``--grant`` options of ``pub`` and ``sub``.

The parser half of this module loads nothing heavy (``trellis`` builds every parser for every
command); each handler imports the SDK and the cryptography when it runs.

Files:

- identity file (``--identity``): ``{"id": ..., "key": "<hex private key>"}``, mode 0600
  (``trellis topic identity --new ID --out FILE``);
- grant file (``--grant``, written by ``topic create`` and ``topic delegate``): ``{"topic":
  uuid, "advertisement": base64 msgpack, "delegation": base64 msgpack or null}``: what a broker
  with secured topics needs to see in HELLO;
- trusted TDNs file (``--trusted``): ``{"tdn-id": "<hex public key>"}``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from security.topics import TopicAdvertisement
    from security.topics_delegations import Delegation

__all__ = ["add_identity_options", "add_topic_parser", "client_identity"]


def add_identity_options(p: argparse.ArgumentParser) -> None:
    """``--identity`` and ``--grant`` for commands that connect as a client."""
    p.add_argument(
        "--identity",
        help="identity file: the client id (unless --client-id) and the key it signs and "
        "proves itself with (default: a fresh key)",
    )
    p.add_argument(
        "--grant",
        action="append",
        default=[],
        metavar="FILE",
        help="grant file for a secured topic (trellis topic create/delegate; repeatable)",
    )


def _read_grant(path: str) -> tuple[TopicAdvertisement, Delegation | None]:
    import base64

    import msgpack

    from broker.errors import InvalidRequest
    from security.topics import TopicAdvertisement
    from security.topics_delegations import Delegation

    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        ad = TopicAdvertisement.from_wire(msgpack.unpackb(base64.b64decode(data["advertisement"])))
        raw = data.get("delegation")
        grant = (
            None if raw is None else Delegation.from_wire(msgpack.unpackb(base64.b64decode(raw)))
        )
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise InvalidRequest(f"cannot read the grant file {path!r}: {exc}") from None
    return ad, grant


def _write_grant(path: str, ad: TopicAdvertisement, grant: Delegation | None) -> None:
    import base64

    import msgpack

    def b64(wire: object) -> str:
        return base64.b64encode(msgpack.packb(wire, use_bin_type=True)).decode()

    Path(path).write_text(
        json.dumps(
            {
                "topic": ad.uuid,
                "advertisement": b64(ad.to_wire()),
                "delegation": None if grant is None else b64(grant.to_wire()),
            }
        )
        + "\n",
        encoding="utf-8",
    )


def client_identity(args: argparse.Namespace) -> dict[str, Any]:
    """``Client`` keyword arguments for ``--identity``, ``--grant`` and ``--client-id``."""
    import time

    from broker.errors import InvalidRequest
    from security.topics_credentials import present_credentials
    from security.topics_identity import load_identity

    if not args.identity:
        if args.grant:
            raise InvalidRequest("--grant needs --identity: the grant names the key it is for")
        return {"client_id": args.client_id}
    signer = load_identity(args.identity)
    client_id = args.client_id or signer.id
    grants = [_read_grant(path) for path in args.grant]
    options = {"credentials": present_credentials(signer, client_id, time.time(), grants)}
    return {"client_id": client_id, "signer": signer, "hello_options": options}


def add_topic_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``trellis topic identity|create|discover|delegate``."""
    topic = subparsers.add_parser("topic", help="identities, topics, discovery, delegations")
    verbs = topic.add_subparsers(
        dest="topic_verb",
        required=True,
        metavar="VERB",
        help="identity, create, discover or delegate",
    )

    p = verbs.add_parser("identity", help="make an identity file, or show its principal")
    p.add_argument("file", help="the identity file")
    p.add_argument("--new", metavar="ID", help="write a fresh identity with this id (not over one)")
    p.set_defaults(func=_identity)

    def connecting(p: argparse.ArgumentParser) -> None:
        p.add_argument("--endpoint", required=True, help="HOST:PORT (comma-separated for several)")
        p.add_argument("--trusted", required=True, help="trusted TDNs file")
        p.add_argument("--identity", required=True, help="identity file")
        p.add_argument("--timeout", type=float, default=3.0, help="per request, s (default: 3)")

    p = verbs.add_parser("create", help="create a topic at a TDN; write its grant file")
    connecting(p)
    p.add_argument("synopsis", help="the topic's text (exact and regex queries match it)")
    p.add_argument("--lifetime", type=float, required=True, help="seconds the topic lives")
    p.add_argument(
        "--property",
        action="append",
        default=[],
        metavar="ATTRS",
        help="descriptors as --attrs takes them, e.g. \"kind='sensor',floor=2\"",
    )
    p.add_argument(
        "--discoverer",
        action="append",
        metavar="PRINCIPAL",
        help="who may discover it (hex key; repeatable; default: anyone)",
    )
    p.add_argument("--tdn", help="the TDN to ask (default: the first that answers)")
    p.add_argument("--out", help="write the grant file (the owner's) here")
    p.set_defaults(func=_create)

    p = verbs.add_parser("discover", help="find topics (a TDN, or owners when none answers)")
    connecting(p)
    how = p.add_mutually_exclusive_group(required=True)
    how.add_argument("--exact", help="synopsis equals")
    how.add_argument("--regex", help="synopsis matches in full")
    how.add_argument("--where", help="a filter over the descriptors")
    p.add_argument("--ttl", type=float, default=1.0, help="flood TTL without TDNs (default: 1)")
    p.set_defaults(func=_discover)

    p = verbs.add_parser("delegate", help="as a topic's owner, let a key publish or subscribe")
    p.add_argument("--identity", required=True, help="the owner's identity file")
    p.add_argument("--grant", required=True, help="the owner's grant file of the topic")
    p.add_argument("--holder", required=True, help="the holder: a principal (hex) or identity file")
    p.add_argument(
        "--right", required=True, choices=["publish", "subscribe"], help="what the holder may do"
    )
    p.add_argument("--expires-in", type=float, help="seconds it is valid (default: as the topic)")
    p.add_argument("--out", required=True, help="the holder's grant file")
    p.set_defaults(func=_delegate)


def _identity(args: argparse.Namespace) -> int:
    from broker.errors import InvalidRequest
    from security.envelope import Signer, public_key_to_bytes
    from security.topics_identity import load_identity, save_identity

    if args.new:
        if Path(args.file).exists():
            raise InvalidRequest(f"{args.file} exists already; not overwriting it")
        save_identity(Signer.generate(args.new), args.file)
    signer = load_identity(args.file)
    print(json.dumps({"id": signer.id, "principal": public_key_to_bytes(signer.public_key).hex()}))
    return 0


def _run_topics(args: argparse.Namespace, action: Any) -> Any:
    from broker.client import Client
    from broker.tools.launcher import run_async
    from broker.tools.topics_client import TopicsClient
    from security.topics_identity import load_identity, load_trusted_tdns

    signer = load_identity(args.identity)
    trusted = load_trusted_tdns(args.trusted)

    async def go() -> Any:
        async with (
            Client(args.endpoint.split(","), client_id=signer.id) as client,
            TopicsClient(client, signer, trusted, timeout=args.timeout, answer_floods=False) as t,
        ):
            return await action(t)

    return run_async(go())


def _describe(ad: TopicAdvertisement) -> str:
    return json.dumps(
        {
            "uuid": ad.uuid,
            "synopsis": ad.request.synopsis,
            "descriptors": dict(ad.request.descriptors),
            "owner": ad.owner,
            "tdn": ad.tdn,
            "expires": ad.expires,
            "parent": ad.parent,
        }
    )


def _create(args: argparse.Namespace) -> int:
    from broker.language.grammar import parse_attrs

    descriptors: dict[str, Any] = {}
    for text in args.property:
        descriptors.update(parse_attrs(text))

    async def action(t: Any) -> TopicAdvertisement:
        ad: TopicAdvertisement = await t.create_topic(
            args.synopsis,
            lifetime=args.lifetime,
            descriptors=descriptors,
            discoverers=args.discoverer,
            tdn=args.tdn,
        )
        return ad

    ad = _run_topics(args, action)
    if args.out:
        _write_grant(args.out, ad, None)
    print(_describe(ad))
    return 0


def _discover(args: argparse.Namespace) -> int:
    kind, text = (
        ("exact", args.exact)
        if args.exact is not None
        else ("regex", args.regex)
        if args.regex is not None
        else ("properties", args.where)
    )

    async def action(t: Any) -> list[TopicAdvertisement]:
        found: list[TopicAdvertisement] = await t.discover(kind, text, ttl=args.ttl)
        return found

    for ad in _run_topics(args, action):
        print(_describe(ad))
    return 0


def _delegate(args: argparse.Namespace) -> int:
    import time

    from broker.errors import InvalidRequest
    from security.envelope import public_key_to_bytes
    from security.topics_delegations import delegate
    from security.topics_identity import load_identity

    owner = load_identity(args.identity)
    ad, _ = _read_grant(args.grant)
    if Path(args.holder).exists():
        holder = public_key_to_bytes(load_identity(args.holder).public_key)
    else:
        try:
            holder = bytes.fromhex(args.holder)
        except ValueError:
            holder = b""
        if len(holder) != 32:
            raise InvalidRequest("--holder must be a 64-hex-digit principal or an identity file")
    now = time.time()
    expires = None if args.expires_in is None else now + args.expires_in
    grant = delegate(owner, ad, holder, args.right, now=now, expires=expires)
    _write_grant(args.out, ad, grant)
    print(
        json.dumps(
            {"topic": ad.uuid, "holder": holder.hex(), "right": args.right, "expires": expires}
        ),
        file=sys.stderr,
    )
    return 0
