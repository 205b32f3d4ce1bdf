"""The broker's traffic-log writer: schema, batching, rotation, retention, torn lines."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

from analytics.schema import field_names, log_files, read_records, schema_version
from broker.daemon.config import BrokerConfig
from broker.daemon.traffic_log import WRITER_FIELDS, TrafficLog, log_dir, open_traffic_log


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
            "neighbours": [{"id": "b0.1", "endpoint": "h:1", "vn": "b0", "replica": 1}],
            "traffic_log": {"dir": str(tmp_path), **log},
        }
    )


def pub(tlog: TrafficLog, seq: int, t: float | None = None) -> tuple[object, ...]:
    source, sender = FakeHop("b0", True), "b0.1"
    targets = {FakeHop("b2", True): ["k"], FakeHop("alice", False): ["s1"]}
    route = (source, sender, *targets)
    hops = tlog.hops.get(route) or tlog.hops_fragment(route, source, sender, targets, None)
    return ("pub", t or time.time(), "pub-1", seq, hops, 10, False, 1234)


def test_writer_and_job_share_one_schema() -> None:
    assert tuple(field_names()) == WRITER_FIELDS
    assert schema_version() == 1


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
    tlog.close()
    records = list(read_records(tmp_path))
    kinds = [r["k"] for r in records]
    assert kinds == ["meta", "pub", "pub", "pub", "copy", "share", "link"]
    meta, first = records[0], records[1]
    assert meta["nb"] == [{"id": "b0.1", "vn": "b0", "r": 1}]
    assert meta["vs"] == 3
    assert (first["next"], first["loc"], first["prev"]) == (["b2"], ["alice"], "b0")
    assert (first["from"], first["dig"], first["pc"]) == ("b0.1", 1234, False)
    assert (records[5]["why"], records[5]["cul"]) == ('bad "split"', "b0.1")
    assert all(set(r) <= set(WRITER_FIELDS) for r in records)


def test_a_torn_last_line_is_skipped(tmp_path: Path) -> None:
    tlog = TrafficLog(config(tmp_path), tmp_path)
    tlog.append(pub(tlog, 1))
    tlog.append(pub(tlog, 2))
    tlog.close()
    (path,) = log_files(tmp_path)
    whole = path.read_text(encoding="utf-8")
    path.write_text(whole + whole.splitlines()[-1][:40], encoding="utf-8")
    assert [r.get("s") for r in read_records(tmp_path)] == [None, 1, 2]


def test_files_rotate_by_size_and_old_ones_are_deleted(tmp_path: Path) -> None:
    tlog = TrafficLog(
        config(tmp_path, rotate_bytes=4096, retention_bytes=3 * 4096 + 2048), tmp_path
    )
    for batch in range(12):
        for seq in range(20):
            tlog.append(pub(tlog, batch * 100 + seq))
        tlog.flush()
    tlog.close()
    files = log_files(tmp_path)
    assert len(files) + tlog.files_deleted >= 6  # ~8 KiB per file: two batches each
    assert tlog.files_deleted >= 3
    assert sum(p.stat().st_size for p in files) <= 3 * 4096 + 2048
    # Every surviving file starts with its meta record and holds whole lines only.
    for path in files:
        lines = path.read_text(encoding="utf-8").splitlines()
        assert json.loads(lines[0])["k"] == "meta"
        assert all(json.loads(line)["v"] == 1 for line in lines)


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
