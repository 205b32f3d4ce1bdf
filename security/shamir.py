"""Shamir secret sharing over GF(2^8), byte-wise, tuned for whole byte strings in pure Python.

Every byte of the secret is shared with its own polynomial, and all polynomials of one split use
the same x coordinates, so a share is simply ``(x, bytes)`` with ``len(bytes) == len(secret)``.
The field is GF(2^8) modulo x^8 + x^4 + x^3 + x^2 + 1 (0x11D, generator 2): the same field and
share layout as libgfshare, so shares interoperate with it (the benchmark checks this).

Why it is fast without C: a scalar times a whole vector is one ``bytes.translate`` with a
precomputed 256-byte table for that scalar, and the XOR of whole vectors is one XOR of big
integers. A split therefore costs n·(k-1) translates, one ``int.from_bytes`` and one ``to_bytes``
regardless of the secret's length; a combine costs k translates and one conversion each way, with
the Lagrange coefficients at 0 computed once per set of x coordinates and cached.

Security: coefficients come from ``os.urandom`` (the same source as ``secrets``); any k-1 shares
are independent of the secret (perfect secrecy, tested exhaustively for small cases). Nothing
here authenticates shares: a corrupted share yields a wrong secret, which is why propagation.py
commits to every share.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from operator import attrgetter

from security.errors import InvalidRequest

__all__ = [
    "MAX_SHARES",
    "InconsistentSharesError",
    "Share",
    "ShareError",
    "combine",
    "interpolate",
    "split",
    "trusted_share",
]

MAX_SHARES = 255
"""The field has 255 non-zero elements, hence at most 255 distinct share coordinates."""

_POLY = 0x11D


def _build_tables() -> tuple[list[int], list[int], list[bytes]]:
    exp = [0] * 510
    log = [0] * 256
    value = 1
    for power in range(255):
        exp[power] = value
        log[value] = power
        value <<= 1
        if value & 0x100:
            value ^= _POLY
    # Doubling the exp table lets log sums up to 508 index it without a modulo.
    exp[255:510] = exp[0:255]
    mul = [bytes(256)]
    for c in range(1, 256):
        log_c = log[c]
        mul.append(bytes([0, *(exp[log_c + log[b]] for b in range(1, 256))]))
    return exp, log, mul


_EXP, _LOG, _MUL = _build_tables()
_IDENTITY = _MUL[1]
_from_bytes = int.from_bytes
_translate = bytes.translate


class ShareError(InvalidRequest):
    """Shares or parameters are malformed: fix the input, retrying cannot help."""


class InconsistentSharesError(ShareError):
    """More than k shares were given and they do not lie on one polynomial of degree k-1.

    Attributes:
        bad_x: x coordinates of the extra shares that disagree with the first k.
    """

    def __init__(self, message: str, bad_x: tuple[int, ...] = ()) -> None:
        super().__init__(message)
        self.bad_x = bad_x


@dataclass(frozen=True, slots=True)
class Share:
    """One Shamir share: the polynomials of every secret byte evaluated at ``x``.

    Attributes:
        x: the share's coordinate, 1..255 (0 would be the secret itself).
        data: one byte per secret byte.
    """

    x: int
    data: bytes

    def __post_init__(self) -> None:
        if type(self.x) is not int or not 1 <= self.x <= MAX_SHARES:
            raise ShareError(f"share x must be an int in 1..{MAX_SHARES}, got {self.x!r}")
        if not isinstance(self.data, bytes):
            raise ShareError(f"share data must be bytes, got {type(self.data).__name__}")


# A frozen dataclass's __init__ goes through object.__setattr__ and costs about 3x a plain
# object; split() builds shares it knows are valid, so it sets the slots directly.
_new_share = object.__new__
_set_x = Share.__dict__["x"].__set__
_set_data = Share.__dict__["data"].__set__


def trusted_share(x: int, data: bytes) -> Share:
    """A :class:`Share` built without the checks of its constructor, for callers that
    know ``x`` is in 1..255 and ``data`` is bytes (a reconstruction builds one per child
    of every split it recovers, and the checks would cost more than the arithmetic)."""
    share = _new_share(Share)
    _set_x(share, x)
    _set_data(share, data)
    return share


_CACHE_LIMIT = 4096
# Plain dicts rather than lru_cache: a dict lookup costs a third of an lru_cache call, which
# shows at these sizes. They are cleared when full (real deployments use a handful of keys).
_split_cache: dict[tuple[int, int], tuple[bytes, ...]] = {}
_lagrange_cache: dict[tuple[tuple[int, ...], int], tuple[bytes, ...]] = {}


def _split_tables(n: int, k: int) -> tuple[bytes, ...]:
    """Translate tables for one (n, k), coefficient-major: identity for the secret, then x^j."""
    tables = [_IDENTITY] * n
    for j in range(1, k):
        tables.extend(_MUL[_EXP[(_LOG[x] * j) % 255]] for x in range(1, n + 1))
    if len(_split_cache) >= _CACHE_LIMIT:
        _split_cache.clear()
    result = _split_cache[n, k] = tuple(tables)
    return result


def _check_params(k: int, n: int) -> None:
    if type(k) is not int or type(n) is not int:
        raise ShareError(f"k and n must be ints, got k={k!r}, n={n!r}")
    if not 1 <= k <= n <= MAX_SHARES:
        raise ShareError(f"need 1 <= k <= n <= {MAX_SHARES}, got k={k}, n={n}")


def split(secret: bytes, k: int, n: int) -> list[Share]:
    """Split ``secret`` into ``n`` shares, any ``k`` of which recover it.

    Share i (0-based) has x = i + 1. ``k == 1`` gives n copies of the secret (a degree-0
    polynomial): it is allowed because a one-replica virtual node uses it, but offers no secrecy.

    Args:
        secret: bytes of any length (an empty secret gives empty shares).
        k: threshold, 1 <= k <= n.
        n: number of shares, at most 255.

    Returns:
        The n shares, in x order.

    Raises:
        ShareError: k or n out of range, or secret not bytes.
    """
    _check_params(k, n)
    if not isinstance(secret, bytes):
        raise ShareError(f"secret must be bytes, got {type(secret).__name__}")
    size = len(secret)
    blocks = [secret] * n
    if k > 1 and size:
        noise = os.urandom((k - 1) * size)
        for start in range(0, (k - 1) * size, size):
            blocks += [noise[start : start + size]] * n
        # Block (j, x) is coefficient j times x^j; XOR-folding the k rows of n blocks evaluates
        # every polynomial at every x in one pass of big-integer XORs.
        tables = _split_cache.get((n, k)) or _split_tables(n, k)
        stacked = _from_bytes(b"".join(map(_translate, blocks, tables)))
        row_bits = n * size * 8
        acc = stacked
        for j in range(1, k):
            acc ^= stacked >> (row_bits * j)
        flat = (acc & ((1 << row_bits) - 1)).to_bytes(n * size)
    else:
        flat = b"".join(blocks)
    shares = []
    for i in range(n):
        share = _new_share(Share)
        _set_x(share, i + 1)
        _set_data(share, flat[i * size : (i + 1) * size])
        shares.append(share)
    return shares


def _lagrange_tables(xs: tuple[int, ...], at: int) -> tuple[bytes, ...]:
    """Translate tables of the Lagrange basis polynomials of ``xs`` evaluated at ``at``.

    l_i(at) = prod_{j != i} (at - x_j) / (x_i - x_j); in characteristic 2, minus is XOR.
    Callers guarantee ``at`` is not one of ``xs`` and the xs are distinct and non-zero.
    """
    tables = []
    for i, x_i in enumerate(xs):
        log_sum = 0
        for j, x_j in enumerate(xs):
            if j != i:
                log_sum += _LOG[at ^ x_j] - _LOG[x_i ^ x_j]
        tables.append(_MUL[_EXP[log_sum % 255]])
    if len(_lagrange_cache) >= _CACHE_LIMIT:
        _lagrange_cache.clear()
    result = _lagrange_cache[xs, at] = tuple(tables)
    return result


def _evaluate(xs: tuple[int, ...], ys: Sequence[bytes], size: int, at: int) -> bytes:
    if len(xs) == 1:
        return ys[0]
    tables = _lagrange_cache.get((xs, at)) or _lagrange_tables(xs, at)
    stacked = _from_bytes(b"".join(map(_translate, ys, tables)))
    bits = size * 8
    acc = stacked
    for i in range(1, len(xs)):
        acc ^= stacked >> (bits * i)
    return (acc & ((1 << bits) - 1)).to_bytes(size)


_get_data = attrgetter("data")


def _validated(shares: Sequence[Share], k: int) -> tuple[tuple[int, ...], list[bytes], int]:
    # Kept to a few C-level passes (map, attrgetter, set): at k = 3 the checks would otherwise
    # cost more than the interpolation itself. A tuple of x coordinates already in the Lagrange
    # cache was validated when it was put there.
    if type(k) is not int or not 1 <= k <= MAX_SHARES:
        raise ShareError(f"k must be an int in 1..{MAX_SHARES}, got {k!r}")
    count = len(shares)
    if count < k:
        raise ShareError(f"need at least k={k} shares, got {count}")
    xs = tuple([share.x for share in shares if type(share) is Share])
    if len(xs) != count:
        other = next(share for share in shares if type(share) is not Share)
        raise ShareError(f"expected Share, got {type(other).__name__}")
    ys = list(map(_get_data, shares))
    if count > k or (xs, 0) not in _lagrange_cache:
        if min(xs) < 1 or max(xs) > MAX_SHARES:
            raise ShareError(f"share x must be in 1..{MAX_SHARES}, got {sorted(xs)}")
        if len(set(xs)) != count:
            duplicates = sorted({x for x in xs if xs.count(x) > 1})
            raise ShareError(f"duplicate share x coordinates: {duplicates}")
    size = len(ys[0])
    if count > 1 and len(set(map(len, ys))) != 1:
        raise ShareError(f"shares differ in length: {sorted(set(map(len, ys)))}")
    return xs, ys, size


def combine(shares: Sequence[Share], k: int) -> bytes:
    """Recover the secret from at least ``k`` shares of one split.

    The first k shares determine the secret. Any further shares are checked against the
    polynomial those k define, so an inconsistent set raises instead of returning a wrong secret
    silently; pass exactly k shares when speed matters and consistency is checked elsewhere.

    Raises:
        ShareError: fewer than k shares, duplicate x, x out of 1..255, shares of different
            lengths, or a non-Share element.
        InconsistentSharesError: extra shares disagree with the first k.
    """
    xs, ys, size = _validated(shares, k)
    if len(xs) == k:
        return _evaluate(xs, ys, size, 0)
    first, first_ys = xs[:k], ys[:k]
    secret = _evaluate(first, first_ys, size, 0)
    bad = tuple(
        xs[i] for i in range(k, len(xs)) if _evaluate(first, first_ys, size, xs[i]) != ys[i]
    )
    if bad:
        raise InconsistentSharesError(
            f"shares at x={list(bad)} do not lie on the polynomial of the first {k}", bad
        )
    return secret


def interpolate(shares: Sequence[Share], k: int, x: int) -> bytes:
    """Evaluate the polynomial through the first ``k`` shares at ``x`` (0 gives the secret).

    Used to check whether a further share is consistent with k others, or to rebuild a missing
    share, without recovering the secret first.

    Raises:
        ShareError: as for :func:`combine`, or x out of 0..255.
    """
    if type(x) is not int or not 0 <= x <= MAX_SHARES:
        raise ShareError(f"x must be an int in 0..{MAX_SHARES}, got {x!r}")
    xs, ys, size = _validated(shares, k)
    xs, ys = xs[:k], ys[:k]
    if x in xs:
        return ys[xs.index(x)]
    return _evaluate(xs, ys, size, x)
