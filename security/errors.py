"""The one exception hierarchy of Trellis: a root and its families, importable everywhere.

Every package raises errors under :class:`TrellisError`, so a caller of any layer (the
SDK, the CLI, a solver, the overlay model) can catch one class. The hierarchy lives here
because ``security`` is the one package that imports no other Trellis package: the
overlay model, the reconfiguration solvers and the broker may all import it without
creating a cycle. ``broker.errors`` re-exports the families with the broker's own leaves
(filters, payload size, slow consumers) as the SDK's public error module.

Families are split by what the caller should do next: retry (:class:`ConnectionLost`,
:class:`TrellisTimeout`), fix the input (:class:`InvalidRequest` and its children), give up
(:class:`NotAuthorized`, :class:`ProtocolError`), or distrust the data
(:class:`IntegrityError`: a signature, share or ciphertext failed its check). Every class
carries its data as attributes and a stable wire ``code``.
"""

from __future__ import annotations

__all__ = [
    "ConnectionLost",
    "IntegrityError",
    "InvalidRequest",
    "NotAuthorized",
    "ProtocolError",
    "TrellisError",
    "TrellisTimeout",
]


class TrellisError(Exception):
    """Root of every error Trellis raises.

    Attributes:
        message: the human-readable explanation (also ``str(exc)``).
    """

    code: str = "internal"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidRequest(TrellisError, ValueError):
    """The request or input itself is wrong: fix it, retrying the same bytes cannot help.

    Also a ``ValueError``, so code written against the standard library keeps working.
    """

    code = "invalid_request"


class ProtocolError(TrellisError):
    """The peer broke the wire protocol (malformed frame, unknown type, wrong order)."""

    code = "protocol"


class NotAuthorized(TrellisError):
    """The peer is not allowed to do this; retrying will not help."""

    code = "not_authorized"


class ConnectionLost(TrellisError):
    """The connection to the broker went away; the SDK reconnects, the caller may retry."""

    code = "connection_lost"


class TrellisTimeout(TrellisError, TimeoutError):
    """A network wait ran out of time; the caller may retry.

    Also a builtin ``TimeoutError``, so ``except TimeoutError`` catches it as well.
    """

    code = "timeout"


class IntegrityError(TrellisError, ValueError):
    """Data failed a cryptographic or structural check (a signature, a key share, a
    ciphertext's tag): whoever produced it is faulty, retrying with it cannot help."""

    code = "integrity"
