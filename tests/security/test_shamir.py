"""Shamir (k, n) over GF(2^8): correctness, perfect secrecy, and strict input checking."""

from __future__ import annotations

import ctypes
import ctypes.util
import itertools
import os
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from security import shamir
from security.shamir import InconsistentSharesError, Share, ShareError, combine, interpolate, split


@st.composite
def splits(draw: st.DrawFn) -> tuple[bytes, int, int, list[int]]:
    n = draw(st.integers(1, 12))
    k = draw(st.integers(1, n))
    secret = draw(st.binary(min_size=0, max_size=80))
    order = draw(st.permutations(list(range(n))))
    return secret, k, n, order


@settings(max_examples=150, deadline=None)
@given(splits())
def test_any_k_shares_in_any_order_reconstruct_the_secret(
    case: tuple[bytes, int, int, list[int]],
) -> None:
    secret, k, n, order = case
    shares = split(secret, k, n)
    assert [s.x for s in shares] == list(range(1, n + 1))
    assert all(len(s.data) == len(secret) for s in shares)
    assert combine([shares[i] for i in order[:k]], k) == secret
    assert combine([shares[i] for i in order], k) == secret


def test_every_k_subset_reconstructs_for_the_bench_sizes() -> None:
    secret = os.urandom(32)
    for n in (3, 5, 10):
        k = (n - 1) // 2 + 1
        shares = split(secret, k, n)
        for subset in itertools.combinations(shares, k):
            assert combine(list(subset), k) == secret


@settings(max_examples=60, deadline=None)
@given(st.binary(min_size=1, max_size=40), st.integers(2, 8), st.data())
def test_interpolate_rebuilds_a_missing_share(secret: bytes, n: int, data: st.DataObject) -> None:
    k = data.draw(st.integers(1, n - 1))
    shares = split(secret, k, n)
    missing = data.draw(st.sampled_from(shares))
    others = [s for s in shares if s is not missing][:k]
    assert interpolate(others, k, missing.x) == missing.data
    assert interpolate(others, k, 0) == secret


def _enumerated_randomness(monkeypatch: pytest.MonkeyPatch, stream: Iterator[bytes]) -> None:
    monkeypatch.setattr(shamir.os, "urandom", lambda size: next(stream))


@pytest.mark.parametrize(
    ("k", "n", "secret"), [(2, 3, bytes(range(256))), (3, 3, b"\x00\x01\xa7\xff")]
)
def test_k_minus_1_shares_are_uniform_whatever_the_secret(
    monkeypatch: pytest.MonkeyPatch, k: int, n: int, secret: bytes
) -> None:
    """Exhaustive over all coefficients: every (k-1)-subset of shares of a one-byte secret takes
    every possible value exactly once, for every secret tried, so it reveals nothing.

    Bytes are shared independently, so each byte position of ``secret`` is one secret under
    test; feeding the same coefficients to every position enumerates them all in one pass.
    """
    size = len(secret)
    space = [
        b"".join(bytes([c]) * size for c in coefficients)
        for coefficients in itertools.product(range(256), repeat=k - 1)
    ]
    _enumerated_randomness(monkeypatch, iter(space))
    subsets = list(itertools.combinations(range(n), k - 1))
    seen: list[list[bytes]] = [[] for _ in subsets]
    for _ in space:
        shares = split(secret, k, n)
        for values, xs in zip(seen, subsets, strict=True):
            values.append(b"".join(shares[i].data for i in xs))
    for values in seen:
        for position in range(size):
            assert len({v[position::size] for v in values}) == len(values) == 256 ** (k - 1)


def test_k_shares_separate_secrets_so_the_secrecy_check_can_fail(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Control for the test above: k shares of different secrets never coincide."""
    seen = []
    for secret in (0x00, 0x01):
        _enumerated_randomness(monkeypatch, (bytes([c]) for c in range(256)))
        seen.append(
            {tuple(s.data[0] for s in split(bytes([secret]), 2, 3)[:2]) for _ in range(256)}
        )
    assert len(seen[0]) == 256
    assert not seen[0] & seen[1]


def test_one_of_one_and_empty_secrets_are_trivial() -> None:
    assert split(b"abc", 1, 3) == [Share(x, b"abc") for x in (1, 2, 3)]
    assert combine(split(b"", 2, 3)[:2], 2) == b""


@pytest.mark.parametrize(
    ("k", "n"), [(0, 3), (4, 3), (1, 256), (2, 0), (True, 3), (2.0, 3)], ids=str
)
def test_split_rejects_impossible_parameters(k: int, n: int) -> None:
    with pytest.raises(ShareError):
        split(b"secret", k, n)


def test_split_rejects_a_non_bytes_secret() -> None:
    with pytest.raises(ShareError, match="bytes"):
        split("secret", 2, 3)  # type: ignore[arg-type]


def test_combine_rejects_fewer_than_k_shares() -> None:
    shares = split(b"secret", 3, 5)
    with pytest.raises(ShareError, match="at least k=3"):
        combine(shares[:2], 3)


def test_combine_rejects_duplicate_x() -> None:
    shares = split(b"secret", 2, 3)
    with pytest.raises(ShareError, match="duplicate"):
        combine([shares[0], shares[0]], 2)


def test_combine_rejects_shares_of_different_lengths() -> None:
    with pytest.raises(ShareError, match="length"):
        combine([Share(1, b"ab"), Share(2, b"abc")], 2)


def test_share_with_x_zero_or_out_of_range_is_rejected() -> None:
    for x in (0, 256, -1):
        with pytest.raises(ShareError, match="x"):
            Share(x, b"a")
    forged = object.__new__(Share)
    object.__setattr__(forged, "x", 0)
    object.__setattr__(forged, "data", b"a")
    with pytest.raises(ShareError, match=r"1\.\.255"):
        combine([forged, Share(1, b"b")], 2)


def test_combine_rejects_non_shares_and_bad_k() -> None:
    with pytest.raises(ShareError, match="Share"):
        combine([(1, b"a"), (2, b"b")], 2)  # type: ignore[list-item]
    with pytest.raises(ShareError, match="k must"):
        combine(split(b"a", 2, 3), 0)


def test_combine_with_extra_shares_names_the_inconsistent_ones() -> None:
    shares = split(b"0123456789abcdef", 2, 5)
    bad = Share(4, bytes(b ^ 1 for b in shares[3].data))
    with pytest.raises(InconsistentSharesError) as info:
        combine([shares[0], shares[1], shares[2], bad, shares[4]], 2)
    assert info.value.bad_x == (4,)


# deploy/setup.sh installs libgfshare (Debian package libgfshare2).
_GFSHARE = ctypes.util.find_library("gfshare") or "libgfshare.so.2"


def test_shares_interoperate_with_libgfshare_in_both_directions() -> None:
    """Same field (0x11D) and layout as the C library, so the benchmark compares like with like."""
    try:
        lib = ctypes.CDLL(_GFSHARE)
    except OSError as exc:
        pytest.skip(f"libgfshare is not installed ({exc}); bash deploy/setup.sh installs it")
    ctypes.c_void_p.in_dll(lib, "gfshare_fill_rand").value = ctypes.c_void_p.in_dll(
        lib, "gfshare_bad_idea_but_fill_rand_using_random"
    ).value
    lib.gfshare_ctx_init_enc.restype = ctypes.c_void_p
    lib.gfshare_ctx_init_enc.argtypes = [
        ctypes.c_char_p,
        ctypes.c_uint,
        ctypes.c_ubyte,
        ctypes.c_uint,
    ]
    lib.gfshare_ctx_init_dec.restype = ctypes.c_void_p
    lib.gfshare_ctx_init_dec.argtypes = [ctypes.c_char_p, ctypes.c_uint, ctypes.c_uint]
    lib.gfshare_ctx_enc_setsecret.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    lib.gfshare_ctx_enc_getshare.argtypes = [ctypes.c_void_p, ctypes.c_ubyte, ctypes.c_char_p]
    lib.gfshare_ctx_dec_giveshare.argtypes = [ctypes.c_void_p, ctypes.c_ubyte, ctypes.c_char_p]
    lib.gfshare_ctx_dec_extract.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    lib.gfshare_ctx_free.argtypes = [ctypes.c_void_p]
    secret = os.urandom(32)
    ctx = lib.gfshare_ctx_init_enc(bytes([1, 2, 3, 4, 5]), 5, 3, 32)
    lib.gfshare_ctx_enc_setsecret(ctx, secret)
    theirs = []
    for i in range(5):
        buf = ctypes.create_string_buffer(32)
        lib.gfshare_ctx_enc_getshare(ctx, i, buf)
        theirs.append(Share(i + 1, buf.raw))
    lib.gfshare_ctx_free(ctx)
    assert combine(theirs[2:], 3) == secret

    ours = split(secret, 3, 5)[1:4]
    ctx = lib.gfshare_ctx_init_dec(bytes(s.x for s in ours), 3, 32)
    for i, share in enumerate(ours):
        lib.gfshare_ctx_dec_giveshare(ctx, i, share.data)
    out = ctypes.create_string_buffer(32)
    lib.gfshare_ctx_dec_extract(ctx, out)
    lib.gfshare_ctx_free(ctx)
    assert out.raw == secret
