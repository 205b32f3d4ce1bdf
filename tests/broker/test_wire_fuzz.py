"""Fuzzing a real broker process: every frame type and field, from clients, neighbour
brokers and control connections, and the filter parser. The broker never crashes, answers
bad input with an ERROR, closes only the offending connection, and keeps neither file
descriptors nor memory from the connections it closed.

The long run (tens of thousands of sessions): ``bench/bench_reliability.py fuzz``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.errors import InvalidRequest, TrellisError
from broker.language.grammar import parse_attrs, parse_filter
from broker.tools.launcher import BrokerProcess, start_broker
from broker.wire.protocol import MsgType, decode_body
from tests.fuzz_wire import (
    FUZZ_BROKER,
    FuzzTarget,
    Witness,
    fuzzed_broker_settings,
    sessions,
)
from tests.hosts.scenarios import fd_count, rss_kib

_SETTINGS = settings(
    max_examples=int(os.environ.get("TRELLIS_FUZZ_EXAMPLES", "400")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@pytest.fixture(scope="module")
def fuzzed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    workdir: Path = tmp_path_factory.mktemp("fuzz")
    proc = start_broker(workdir, FUZZ_BROKER, settings=fuzzed_broker_settings())
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def target(fuzzed: BrokerProcess) -> FuzzTarget:
    return FuzzTarget(fuzzed.host, fuzzed.port)


@pytest.fixture(scope="module")
def witness(fuzzed: BrokerProcess) -> Iterator[Witness]:
    w = Witness(fuzzed.host, fuzzed.port)
    w.check()
    yield w
    w.close()


@pytest.mark.slow
@_SETTINGS
@given(session=sessions())
def test_fuzzed_frames_get_an_answer_or_an_error_and_a_close(
    fuzzed: BrokerProcess, target: FuzzTarget, witness: Witness, session: tuple[str, list[bytes]]
) -> None:
    target.session(*session)
    assert fuzzed.alive(), f"the broker died: see {fuzzed.log_path}"
    if target.sessions % 10 == 0:
        witness.check()


@pytest.mark.slow
def test_the_fuzzing_reached_both_outcomes_and_the_witness_was_served(
    target: FuzzTarget, witness: Witness
) -> None:
    """The run above is no test of anything if every session was accepted or refused."""
    assert target.answered > 0, target
    assert target.closed_with_error > 0, target
    assert {"protocol", "invalid_request"} <= set(target.codes), target.codes
    witness.check()


@pytest.mark.slow
def test_bad_connections_leave_no_file_descriptors_or_memory_behind(
    fuzzed: BrokerProcess, target: FuzzTarget, witness: Witness
) -> None:
    bad = [
        ("none", [b"\x00\x00\x00\x03\xc1\xc1\xc1"]),  # not msgpack
        ("client", [b"\x00\x00\x00\x02\x92\x07"]),  # a PUBLISH of one field
        ("broker", [b"\x00\x00\x00\x03\x92\x63\x00"]),  # an unknown type from a neighbour
        ("control", [b"\x00\x00\x00\x03\x92\x0e\xc0"]),  # a FORWARD on a control link
    ]

    def hammer(rounds: int) -> None:
        for i in range(rounds):
            role, payload = bad[i % len(bad)]
            outcome = target.session(role, payload, client_id=f"bad-{i}")
            assert not outcome.answered

    hammer(200)  # warm-up: allocator pools and caches reach their working size
    fds, rss = fd_count(fuzzed.pid), rss_kib(fuzzed.pid)
    hammer(1000)
    witness.check()
    assert fd_count(fuzzed.pid) <= fds
    grown = rss_kib(fuzzed.pid) - rss
    assert grown < 2048, f"RSS grew by {grown} KiB over 1000 bad connections"


def test_a_reconfiguration_step_that_is_not_a_string_is_an_invalid_request() -> None:
    """Found by the fuzzer: an unhashable ``op`` was an internal error, not a precise one."""
    body = msgpack.packb([int(MsgType.RECONF), ["lock"], {}], use_bin_type=True)
    with pytest.raises(InvalidRequest, match="field 'op' must be one of"):
        decode_body(body)


tokens = st.sampled_from(
    [
        "class",
        "price",
        "symbol",
        "=",
        "!=",
        "<",
        "<=",
        ">",
        ">=",
        "and",
        "AND",
        "or",
        "not",
        "in",
        "(",
        ")",
        ",",
        "'x'",
        "'",
        '"',
        "1",
        "-2.5e3",
        "1e999",
        "true",
        "prefix",
        "suffix",
        "contains",
        "exists",
        "*",
        "[",
        "]",
        "\\",
        "'\\''",
        " ",
        "\n",
        "\u00e9",
    ]
)


@settings(max_examples=int(os.environ.get("TRELLIS_FUZZ_EXAMPLES", "300")))
@given(st.one_of(st.lists(tokens, max_size=14).map(" ".join), st.text(max_size=40)))
def test_the_filter_parser_raises_only_filter_errors(text: str) -> None:
    try:
        flt = parse_filter(text)
    except TrellisError as exc:
        message = str(exc)
        assert message  # an error that says something
    else:
        assert parse_filter(str(flt)) == flt  # what it parsed, it can print and read back


@settings(max_examples=int(os.environ.get("TRELLIS_FUZZ_EXAMPLES", "300")))
@given(st.one_of(st.lists(tokens, max_size=10).map(" ".join), st.text(max_size=40)))
def test_the_attribute_parser_raises_only_trellis_errors(text: str) -> None:
    try:
        parse_attrs(text)
    except TrellisError as exc:
        message = str(exc)
        assert message
