"""The broker's traffic-log writer: schema, batching, rotation, retention, torn lines."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from analytics.logfile import encode_frame, frames, raw_records
from analytics.schema import (
    field_names,
    log_files,
    read_log,
    read_records,
    record_layouts,
    schema_version,
)
from broker.daemon.config import BrokerConfig
from broker.daemon.traffic_log import WRITER_RECORDS, TrafficLog, log_dir, open_traffic_log


@dataclass(frozen=True)
class FakeHop:
    peer_id: str
    is_broker: bool


def config(tmp_path: Path, **log: object) -> BrokerConfig:
    return BrokerConfig.model_validate(
        {
            "id": "b1.0",
            "vn": "b1",
            "vn_size": 3,
            "neighbours": [
                {"id": "b0.1", "endpoint": "h:1", "vn": "b0", "replica": 1, "vn_size": 3}
            ],
            "traffic_log": {"dir": str(tmp_path), **log},
        }
    )


SOURCE = FakeHop("b0", True)
TARGETS = {FakeHop("b2", True): ["k"], FakeHop("alice", False): ["s1"]}


def pub(tlog: TrafficLog, seq: int, t: float | None = None) -> tuple[object, ...]:
    """What ``Forwarder.route`` appends for a forwarded publication."""
    key = (SOURCE, *TARGETS)
    route = tlog.routes.get(key)
    if route is None:
        route = tlog.define_route(key, SOURCE, TARGETS)
    return ("pub", t or time.time(), "pub-1", seq, route, None, 10, False, 1234)


def test_writer_and_job_share_one_schema() -> None:
    layouts = record_layouts()
    assert {k: tuple(v) for k, v in layouts.items() if k != "sig"} == WRITER_RECORDS
    flat = set(field_names())
    assert all(set(v) - {"route"} <= flat for v in layouts.values())
    assert schema_version() == 2


def test_logging_is_off_without_a_directory() -> None:
    assert log_dir(BrokerConfig()) is None
    assert open_traffic_log(BrokerConfig()) is None
    cfg = BrokerConfig.model_validate({"links_file": "/x/b1.links.json"})
    assert log_dir(cfg) == Path("/x/traffic")


def test_records_round_trip_through_the_reader(tmp_path: Path) -> None:
    tlog = TrafficLog(config(tmp_path), tmp_path)
    for seq in range(1, 4):
        tlog.append(pub(tlog, seq))
    tlog.append(("copy", time.time(), "pub-1", 1, "b0", "b0.2", 99))
    tlog.append(("share", time.time(), "pub-1", 1, "b0.1", False, "b0.1", 'bad "split"'))
    tlog.append(("link", time.time(), "b0.1"))
    slow = FakeHop("bob", False)
    targets = {**TARGETS, slow: ["s2"]}
    tlog.append(
        tlog.dropped_pub(time.time(), "pub-2", 7, FakeHop("pub-2", False), "pub-2", targets,
                         [slow], 5, True, None)
    )  # fmt: skip
    tlog.close()
    records = list(read_records(tmp_path))
    kinds = [r["k"] for r in records]
    assert kinds == ["meta", "pub", "pub", "pub", "copy", "share", "link", "pub"]
    meta, first = records[0], records[1]
    assert meta["nb"] == [{"id": "b0.1", "vn": "b0", "r": 1}]
    assert meta["vs"] == 3
    assert (first["next"], first["loc"], first["prev"]) == (["b2"], ["alice"], "b0")
    assert (first["from"], first["dig"], first["pc"]) == (None, 1234, False)
    assert (records[5]["why"], records[5]["cul"]) == ('bad "split"', "b0.1")
    last = records[-1]
    assert (last["loc"], last["drop"], last["pc"], last["from"]) == (
        ["alice"],
        ["bob"],
        True,
        "pub-2",
    )
    assert all(set(r) <= set(field_names()) for r in records)
    assert all((r["b"], r["vn"], r["r"], r["v"]) == ("b1.0", "b1", 0, 2) for r in records)


def test_a_torn_last_line_is_skipped(tmp_path: Path) -> None:
    tlog = TrafficLog(config(tmp_path), tmp_path)
    tlog.append(pub(tlog, 1))
    tlog.append(pub(tlog, 2))
    tlog.close()
    (path,) = log_files(tmp_path)
    whole = path.read_bytes()
    frame = encode_frame(["link", 1.0, "b0.1"])
    for cut in range(1, len(frame)):
        path.write_bytes(whole + frame[:cut])
        assert [r.get("s") for r in read_records(tmp_path)] == [None, 1, 2]


@given(st.lists(st.lists(st.integers(0, 9), max_size=4), max_size=5), st.binary(max_size=64))
def test_frames_read_back_whole_and_stop_at_any_damage(
    batches: list[list[int]], tail: bytes
) -> None:
    data = b"".join(
        encode_frame([f for x in b for f in ("link", float(x), str(x))]) for b in batches
    )
    assert list(frames(data)) == [
        data[at + 8 : at + 8 + int.from_bytes(data[at : at + 4], "little")] for at in _offsets(data)
    ]
    # Garbage or a cut after whole frames: those frames still read, nothing raises.
    got = list(frames(data + tail))
    assert got[: len(batches)] == list(frames(data))
    for cut in range(len(data)):
        list(frames(data[:cut]))


def _offsets(data: bytes) -> list[int]:
    at, out = 0, []
    while at < len(data):
        out.append(at)
        at += 8 + int.from_bytes(data[at : at + 4], "little")
    return out


def test_files_rotate_by_size_and_old_ones_are_deleted(tmp_path: Path) -> None:
    tlog = TrafficLog(
        config(tmp_path, rotate_bytes=4096, retention_bytes=3 * 4096 + 2048), tmp_path
    )
    for batch in range(12):
        for seq in range(100):
            tlog.append(pub(tlog, batch * 1000 + seq))
        tlog.flush()
    tlog.close()
    files = log_files(tmp_path)
    assert len(files) + tlog.files_deleted >= 6  # ~6 KiB per file: two batches each
    assert tlog.files_deleted >= 3
    assert sum(p.stat().st_size for p in files) <= 3 * 4096 + 2048
    # Every surviving file starts with its meta record and its routes, and reads whole.
    for path in files:
        recs = list(raw_records(path))
        assert recs[0][0] == "meta"
        assert recs[1][0] == "route"
        data = path.read_bytes()
        assert sum(8 + len(b) for b in frames(data)) == len(data)
        assert all(r["k"] in ("meta", "pub") for r in read_records(path))


def test_files_rotate_by_time(tmp_path: Path) -> None:
    tlog = TrafficLog(config(tmp_path, rotate_seconds=0.05), tmp_path)
    tlog.append(pub(tlog, 1))
    tlog.flush()
    time.sleep(0.1)
    tlog.append(pub(tlog, 2))
    tlog.flush()
    tlog.close()
    assert len(log_files(tmp_path)) == 2


def test_the_writer_thread_flushes_without_being_asked(tmp_path: Path) -> None:
    tlog = TrafficLog(config(tmp_path, flush_interval=0.05), tmp_path)
    tlog.append(pub(tlog, 1))
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and not any(r["k"] == "pub" for r in read_records(tmp_path)):
        time.sleep(0.02)
    assert [r["s"] for r in read_records(tmp_path) if r["k"] == "pub"] == [1]
    tlog.close()


def _flat(rows: list[dict[str, object]]) -> list[str]:
    from analytics.compact import arrow_schema

    pa = pytest.importorskip("pyarrow")
    table = pa.Table.from_pylist(rows, schema=arrow_schema())
    return sorted(map(repr, table.to_pylist()))


def test_the_job_s_compaction_equals_the_reader(tmp_path: Path) -> None:
    """The C++ path of :mod:`analytics.compact` yields exactly the reader's flat records,
    and a record out of layout sends the file down the reader's path instead."""
    from analytics.compact import table_of
    from analytics.generate import generate
    from analytics.logfile import FileWriter

    generate(tmp_path / "gen", 300, confidential=0.5)
    for path in log_files(tmp_path / "gen"):
        assert sorted(map(repr, table_of(path).to_pylist())) == _flat(list(read_log(path)))
    meta = {"t": 1.0, "b": "b1.0", "vn": "b1", "r": 0, "vs": 3, "nb": []}
    odd = FileWriter(tmp_path / "traffic-odd.tlog", meta)
    odd.add({"k": "copy", "t": 2.0, "p": "p", "s": 1, "prev": "b0", "from": "b0.1", "dig": 5})
    odd.batch.extend(("pub", "not a time", "p", 1, 0, None, 1, False, None))
    odd.batch.extend(("copy", 3.0, "p", 2, "b0", 7, "six"))  # dig not a number
    odd.batch.extend(("copy", 3.0, "p", 2, "b0", "b0.2", 6))
    odd.close()
    path = tmp_path / "traffic-odd.tlog"
    flat = list(read_log(path))
    assert [r["k"] for r in flat] == ["meta", "copy", "copy"]
    assert sorted(map(repr, table_of(path).to_pylist())) == _flat(flat)


def test_the_job_s_records_and_routes_rebuild_the_flat_records(tmp_path: Path) -> None:
    """What the job reads (records naming a route, and each file's routes table) holds the
    same facts as the flat records: from version-2 files (pub and pubx records), from
    version-1 JSON Lines, with route ids unique across files."""
    from analytics.compact import HOPS, job_tables, table_of
    from analytics.generate import generate
    from analytics.logfile import FileWriter

    generate(tmp_path / "gen", 200, confidential=0.5)
    meta = {"t": 1.0, "b": "b1.0", "vn": "b1", "r": 0, "vs": 3, "nb": []}
    odd = FileWriter(tmp_path / "gen" / "traffic-x.tlog", meta)
    hops = {"prev": "c", "pc": True, "from": "c", "next": ["b2"], "n": 3, "conf": False}
    odd.add({"k": "pub", "t": 2.0, "p": "p", "s": 1, **hops, "loc": ["s1"], "drop": []})
    for s in (2, 3):  # a delivery dropped: hops inline, one route for both
        odd.batch.extend(("pubx", 2.0 + s, "p", s, "c", True, "c", ["b2"], [], ["s1"], 3, False, 0))
    odd.close()
    legacy = tmp_path / "gen" / "b9" / "traffic-0.jsonl"
    legacy.parent.mkdir()
    lines = [
        json.dumps({**r, "v": 1}) + "\n" for r in read_log(tmp_path / "gen" / "traffic-x.tlog")
    ]
    legacy.write_text("".join(lines))
    seen: set[int] = set()
    files = log_files(tmp_path / "gen")
    assert len(files) > 3
    for index, path in enumerate(files):
        records, routes = job_tables(path, index)
        by_id = {r["rid"]: r for r in routes.to_pylist()}
        assert all(rid >> 32 == index for rid in by_id)
        assert not seen & by_id.keys()
        seen |= by_id.keys()
        flat = table_of(path).to_pylist()
        assert len(flat) == records.num_rows
        for got, want in zip(records.to_pylist(), flat, strict=True):
            rid, local = got.pop("rid"), got.pop("hl")
            assert got == {k: v for k, v in want.items() if k not in HOPS}
            if want["k"] == "pub":
                route = by_id[rid]
                assert route["prev"] == want["prev"]
                assert [route[h] for h in HOPS] == [want[h] or [] for h in HOPS]
                assert local == bool(want["loc"] or want["drop"])
            else:
                assert rid is None
                assert local is None
    records, routes = job_tables(tmp_path / "gen" / "traffic-x.tlog", 0)
    assert routes.num_rows == 2  # the pub's route, and one for both pubx records
    assert records.column("rid").to_pylist()[1:] == [0, 1, 1]
