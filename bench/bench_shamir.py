"""Shamir split/combine of a 32-byte key: Trellis vs pycryptodome vs libgfshare (C), one run.

Run: ``.venv/bin/python bench/bench_shamir.py`` (about half a minute). Not a test.

For n = 3, 5, 10 replicas and k = floor((n-1)/2) + 1, every implementation splits a fresh
32-byte key into n shares and combines k of them. Implementations are timed in interleaved
rounds (so machine noise hits all of them alike) and in process CPU time, not wall time: the
benchmark machine is a shared VM with heavy steal, and CPU time is what the broker pays. Each
figure is the median over rounds of the mean CPU time per call within a round.

- pycryptodome's ``Crypto.Protocol.SecretSharing.Shamir`` only shares 16-byte secrets (GF(2^128)),
  so the 32-byte key is split as two 16-byte halves and combined as two halves.
- libgfshare is called through ctypes, which adds per-call overhead (a handful of foreign calls
  per operation). "gfshare" creates and frees a context per operation, as a sender or receiver
  of one message does; "gfshare-reuse" keeps one context per (n, k) and x set, its best case.
  Its random filler is set to its built-in ``random()`` one (fast, not cryptographic) so that
  gfshare is measured at its quickest; a urandom callback would only slow it down.
- "gfshare-C" is libgfshare driven from a small C program compiled in the same run (gcc
  required): the library's own speed with no Python in the way.
"""

from __future__ import annotations

import ctypes
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from Crypto.Protocol.SecretSharing import Shamir as CryptoShamir

from security import shamir

GFSHARE = "/lib/x86_64-linux-gnu/libgfshare.so.2"
NATIVE_ITERATIONS = 100_000

# A C harness for libgfshare without any FFI in the way, compiled in this run when gcc exists:
# the honest comparison with "the C library", beside the ctypes figures a Python broker would see.
# Per operation it creates and frees a context, like the "gfshare" ctypes job; CPU time.
NATIVE_HARNESS = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
typedef struct _gfshare_ctx gfshare_ctx;
typedef void (*gfshare_rand_func_t)(unsigned char*, unsigned int);
extern const gfshare_rand_func_t gfshare_bad_idea_but_fill_rand_using_random;
extern gfshare_rand_func_t gfshare_fill_rand;
gfshare_ctx* gfshare_ctx_init_enc(unsigned char*, unsigned int, unsigned char, unsigned int);
gfshare_ctx* gfshare_ctx_init_dec(unsigned char*, unsigned int, unsigned int);
void gfshare_ctx_free(gfshare_ctx*);
void gfshare_ctx_enc_setsecret(gfshare_ctx*, unsigned char*);
void gfshare_ctx_enc_getshare(gfshare_ctx*, unsigned char, unsigned char*);
void gfshare_ctx_dec_giveshare(gfshare_ctx*, unsigned char, unsigned char*);
void gfshare_ctx_dec_extract(gfshare_ctx*, unsigned char*);
static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}
int main(int argc, char** argv){
  int n=atoi(argv[1]), k=atoi(argv[2]), iters=atoi(argv[3]);
  unsigned char xs[255], secret[32], shares[255][32], out[32];
  for(int i=0;i<n;i++) xs[i]=i+1;
  for(int i=0;i<32;i++) secret[i]=i*7+3;
  gfshare_fill_rand = gfshare_bad_idea_but_fill_rand_using_random;
  volatile unsigned sink=0;
  double t0=now();
  for(int it=0;it<iters;it++){
    gfshare_ctx* c=gfshare_ctx_init_enc(xs,n,k,32);
    gfshare_ctx_enc_setsecret(c,secret);
    for(int i=0;i<n;i++) gfshare_ctx_enc_getshare(c,i,shares[i]);
    gfshare_ctx_free(c); sink+=shares[0][0];
  }
  double t1=now();
  for(int it=0;it<iters;it++){
    gfshare_ctx* c=gfshare_ctx_init_dec(xs,k,32);
    for(int i=0;i<k;i++) gfshare_ctx_dec_giveshare(c,i,shares[i]);
    gfshare_ctx_dec_extract(c,out);
    gfshare_ctx_free(c); sink+=out[0];
  }
  double t2=now();
  if(memcmp(out,secret,32)!=0){fprintf(stderr,"mismatch\n");return 1;}
  printf("%.3f %.3f\n",(t1-t0)/iters*1e6,(t2-t1)/iters*1e6);
  return 0;
}
"""
SIZES = (3, 5, 10)
ROUNDS = 9
ROUND_SECONDS = 0.04


def _load_gfshare() -> ctypes.CDLL | None:
    if not Path(GFSHARE).exists():
        return None
    lib = ctypes.CDLL(GFSHARE)
    filler = ctypes.c_void_p.in_dll(lib, "gfshare_bad_idea_but_fill_rand_using_random")
    ctypes.c_void_p.in_dll(lib, "gfshare_fill_rand").value = filler.value
    u8p, ctx = ctypes.c_char_p, ctypes.c_void_p
    lib.gfshare_ctx_init_enc.restype = ctx
    lib.gfshare_ctx_init_enc.argtypes = [u8p, ctypes.c_uint, ctypes.c_ubyte, ctypes.c_uint]
    lib.gfshare_ctx_init_dec.restype = ctx
    lib.gfshare_ctx_init_dec.argtypes = [u8p, ctypes.c_uint, ctypes.c_uint]
    lib.gfshare_ctx_enc_setsecret.argtypes = [ctx, u8p]
    lib.gfshare_ctx_enc_getshare.argtypes = [ctx, ctypes.c_ubyte, u8p]
    lib.gfshare_ctx_dec_giveshare.argtypes = [ctx, ctypes.c_ubyte, u8p]
    lib.gfshare_ctx_dec_extract.argtypes = [ctx, u8p]
    lib.gfshare_ctx_free.argtypes = [ctx]
    return lib


def _gfshare_ops(
    lib: ctypes.CDLL, k: int, n: int
) -> tuple[Callable[[bytes], list[bytes]], Callable[[list[bytes]], bytes], Callable, Callable]:
    xs = bytes(range(1, n + 1))
    size = 32

    def split(secret: bytes) -> list[bytes]:
        ctx = lib.gfshare_ctx_init_enc(xs, n, k, size)
        lib.gfshare_ctx_enc_setsecret(ctx, secret)
        out = []
        for i in range(n):
            buf = ctypes.create_string_buffer(size)
            lib.gfshare_ctx_enc_getshare(ctx, i, buf)
            out.append(buf.raw)
        lib.gfshare_ctx_free(ctx)
        return out

    def combine(shares: list[bytes]) -> bytes:
        ctx = lib.gfshare_ctx_init_dec(xs[:k], k, size)
        for i, share in enumerate(shares):
            lib.gfshare_ctx_dec_giveshare(ctx, i, share)
        buf = ctypes.create_string_buffer(size)
        lib.gfshare_ctx_dec_extract(ctx, buf)
        lib.gfshare_ctx_free(ctx)
        return buf.raw

    enc = lib.gfshare_ctx_init_enc(xs, n, k, size)
    dec = lib.gfshare_ctx_init_dec(xs[:k], k, size)

    def split_reuse(secret: bytes) -> list[bytes]:
        lib.gfshare_ctx_enc_setsecret(enc, secret)
        out = []
        for i in range(n):
            buf = ctypes.create_string_buffer(size)
            lib.gfshare_ctx_enc_getshare(enc, i, buf)
            out.append(buf.raw)
        return out

    def combine_reuse(shares: list[bytes]) -> bytes:
        for i, share in enumerate(shares):
            lib.gfshare_ctx_dec_giveshare(dec, i, share)
        buf = ctypes.create_string_buffer(size)
        lib.gfshare_ctx_dec_extract(dec, buf)
        return buf.raw

    return split, combine, split_reuse, combine_reuse


def _native_gfshare() -> dict[int, tuple[float, float]]:
    """(split, combine) microseconds per operation of libgfshare called from C, per n."""
    compiler = shutil.which("gcc") or shutil.which("cc")
    if compiler is None or not Path(GFSHARE).exists():
        return {}
    with tempfile.TemporaryDirectory() as tmp:
        source, binary = Path(tmp, "gfshare_bench.c"), Path(tmp, "gfshare_bench")
        source.write_text(NATIVE_HARNESS)
        build = [compiler, "-O2", "-o", str(binary), str(source), f"-L{Path(GFSHARE).parent}"]
        subprocess.run([*build, "-l:libgfshare.so.2"], check=True, capture_output=True)
        figures = {}
        for n in SIZES:
            k = (n - 1) // 2 + 1
            runs = []
            for _ in range(3):
                out = subprocess.run(
                    [str(binary), str(n), str(k), str(NATIVE_ITERATIONS)],
                    check=True,
                    capture_output=True,
                    text=True,
                ).stdout.split()
                runs.append((float(out[0]), float(out[1])))
            figures[n] = (
                statistics.median(r[0] for r in runs),
                statistics.median(r[1] for r in runs),
            )
        return figures


def _time_rounds(jobs: dict[str, Callable[[], object]]) -> dict[str, float]:
    """Median over interleaved rounds of seconds per call, for every job."""
    loops = {}
    for name, job in jobs.items():
        start = time.process_time()
        calls = 0
        while time.process_time() - start < ROUND_SECONDS / 4:
            job()
            calls += 1
        per_call = (time.process_time() - start) / calls
        loops[name] = max(1, int(ROUND_SECONDS / per_call))
    samples: dict[str, list[float]] = {name: [] for name in jobs}
    for _ in range(ROUNDS):
        for name, job in jobs.items():
            count = loops[name]
            start = time.process_time()
            for _ in range(count):
                job()
            samples[name].append((time.process_time() - start) / count)
    return {name: statistics.median(values) for name, values in samples.items()}


def _jobs(
    n: int, k: int, lib: ctypes.CDLL | None
) -> tuple[dict[str, Callable[[], object]], dict[str, Callable[[], object]]]:
    """Split and combine jobs for every implementation, after checking they all agree."""
    secret = os.urandom(32)
    ours = shamir.split(secret, k, n)
    assert shamir.combine(ours[:k], k) == secret
    halves = (secret[:16], secret[16:])
    theirs = [CryptoShamir.split(k, n, half) for half in halves]
    assert b"".join(CryptoShamir.combine(t[:k]) for t in theirs) == secret
    split_jobs: dict[str, Callable[[], object]] = {
        "ours": lambda: shamir.split(secret, k, n),
        "pycryptodome": lambda: [CryptoShamir.split(k, n, half) for half in halves],
    }
    combine_jobs: dict[str, Callable[[], object]] = {
        "ours": lambda: shamir.combine(ours[:k], k),
        "pycryptodome": lambda: [CryptoShamir.combine(t[:k]) for t in theirs],
    }
    if lib is not None:
        g_split, g_combine, g_split_reuse, g_combine_reuse = _gfshare_ops(lib, k, n)
        g_shares = g_split(secret)[:k]
        assert g_combine(g_shares) == secret == g_combine_reuse(g_shares)
        # Same field and layout: our combine reads gfshare's shares.
        assert shamir.combine([shamir.Share(i + 1, s) for i, s in enumerate(g_shares)], k) == (
            secret
        )
        split_jobs["gfshare"] = lambda: g_split(secret)
        split_jobs["gfshare-reuse"] = lambda: g_split_reuse(secret)
        combine_jobs["gfshare"] = lambda: g_combine(g_shares)
        combine_jobs["gfshare-reuse"] = lambda: g_combine_reuse(g_shares)
    return split_jobs, combine_jobs


def main() -> None:
    lib = _load_gfshare()
    native = _native_gfshare()
    print(f"Python {platform.python_version()} on {platform.machine()}, {os.cpu_count()} CPUs")
    print(
        f"libgfshare via ctypes: {'yes' if lib else 'NOT FOUND'}; "
        f"native C harness: {'yes' if native else 'no (needs gcc)'}; "
        f"rounds={ROUNDS}; CPU time per operation\n"
    )
    peers = ("pycryptodome", "gfshare", "gfshare-reuse", "gfshare-C")
    print(f"{'n':>3} {'k':>2} {'op':8} {'impl':14} {'us/op':>9} {'peer/ours':>10}")
    for n in SIZES:
        k = (n - 1) // 2 + 1
        for index, (op, jobs) in enumerate(
            zip(("split", "combine"), _jobs(n, k, lib), strict=True)
        ):
            result = _time_rounds(jobs)
            if n in native:
                result["gfshare-C"] = native[n][index] / 1e6
            mine = result["ours"]
            for name in ("ours", *peers):
                if name in result:
                    ratio = "" if name == "ours" else f"{result[name] / mine:9.1f}x"
                    print(f"{n:>3} {k:>2} {op:8} {name:14} {result[name] * 1e6:9.1f} {ratio:>10}")


if __name__ == "__main__":
    main()
