"""``trellis trust show`` and ``trellis rebuild`` on analytics outputs written as the
job writes them (Parquet tables with the reference's columns, summary.json)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from analytics.reference import TABLES
from broker.tools.cli import main
from broker.tools.local import LocalOverlay
from overlay.tree import star_tree

pq = pytest.importorskip("pyarrow.parquet")
pa = pytest.importorskip("pyarrow")

VNS = {f"v{i}": [f"v{i}.0", f"v{i}.1", f"v{i}.2"] for i in range(6)}


def feedback(w: float, evaluator: str, broker: str, **counts: int) -> dict[str, Any]:
    c = {
        "expected": 100,
        "received": 100,
        "missing": 0,
        "conflicting": 0,
        "bad_signatures": 0,
        "timely": 100,
        "shares_ok": 50,
        "bad_shares": 0,
        **counts,
    }
    c["received"] = c["expected"] - c["missing"]
    c["timely"] = min(c["timely"], c["received"])
    failures = c["missing"] + c["conflicting"] + c["bad_signatures"] + c["bad_shares"]
    events = c["expected"] + c["shares_ok"] + c["bad_shares"]
    judged = c["shares_ok"] + c["bad_shares"]
    row = {
        "w": w,
        "evaluator": evaluator,
        "broker": broker,
        "broker_vn": broker.split(".", maxsplit=1)[0],
        **c,
        "failures": failures,
        "events": events,
        "failure_ratio": failures / events,
        "delivery_ratio": (c["received"] - c["conflicting"]) / c["expected"],
        "share_integrity": c["shares_ok"] / judged if judged else None,
        "timeliness": c["timely"] / c["received"] if c["received"] else None,
    }
    assert list(row) == list(TABLES["trust_feedback"])
    return row


def write_outputs(
    out: Path, trust_rows: list[dict[str, Any]], classes: list[dict[str, Any]]
) -> Path:
    out.mkdir()
    for name, rows in (("trust_feedback", trust_rows), ("classes", classes)):
        (out / name).mkdir()
        table = pa.Table.from_pylist([{**r, "version": 1} for r in rows])
        pq.write_table(table, out / name / "part-00000.parquet")
    (out / "summary.json").write_text(json.dumps({"version": 1, "records": 0}))
    return out


@pytest.fixture
def outputs(tmp_path: Path) -> Path:
    """v2.1 corrupts shares, v2.2 drops publications; v2 sits in the middle of a line."""
    rows = []
    for w in (0.0, 10.0):
        for vn, members in VNS.items():
            for b in members:
                if vn == "v2":
                    continue
                rows.append(feedback(w, "v1.0", b))
        rows.append(feedback(w, "v1.0", "v2.0"))
        rows.append(feedback(w, "v3.0", "v2.1", shares_ok=10, bad_shares=40))
        rows.append(feedback(w, "v3.0", "v2.2", missing=70))
    classes = [
        {"w": 0.0, "src": "v0", "dsts": ["v4", "v5"], "demand": 40},
        {"w": 0.0, "src": "v1", "dsts": ["v3", "v5"], "demand": 20},
        {"w": 10.0, "src": "v0", "dsts": ["v4", "v5"], "demand": 40},
    ]
    for row in classes:
        assert list(row) == list(TABLES["classes"])
    return write_outputs(tmp_path / "out", rows, classes)


def test_trust_show_names_each_culprit_and_what_pulled_it_down(
    outputs: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["trust", "show", "--from", str(outputs)]) == 0
    text = capsys.readouterr().out
    lines = {line.split()[0]: line for line in text.splitlines() if line.startswith("v")}
    assert "share_integrity = 0.200" in lines["v2.1"]
    assert "delivery_ratio = 0.300" in lines["v2.2"]
    assert lines["v2.0"].split()[2] == "1.000"
    assert "v2 0.200" in text  # the VN is as trusted as its worst replica

    assert main(["trust", "show", "--from", str(outputs), "--json", "--curve", "v2.1"]) == 0
    data = json.loads(capsys.readouterr().out)
    by_broker = {b["broker"]: b for b in data["brokers"]}
    assert by_broker["v2.1"]["pulled_down_by"] == "share_integrity"
    assert by_broker["v0.0"]["pulled_down_by"] is None
    assert [w for w, _t in data["curve"]] == [0.0, 10.0]


def test_trust_show_reads_priors_and_the_function_from_the_trust_section(
    outputs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "trust.toml"
    config.write_text('[trust]\nfunction = "weighted"\npriors = { "v4" = 0.3 }\n')
    assert main(["trust", "show", "--from", str(outputs), "--config", str(config), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    by_broker = {b["broker"]: b for b in data["brokers"]}
    assert data["function"] == "weighted"
    assert by_broker["v4.1"]["pulled_down_by"] == "operator_prior"
    assert by_broker["v4.1"]["trust"] == pytest.approx(0.93)
    config.write_text("[trust]\nfuncton = 'min'\n")
    assert main(["trust", "show", "--from", str(outputs), "--config", str(config)]) == 2
    assert "trust.funct" in capsys.readouterr().err


def test_trust_show_refuses_a_directory_that_is_not_an_analytics_output(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["trust", "show", "--from", str(tmp_path)]) == 2
    assert "no summary.json" in capsys.readouterr().err


def overlay_dir(tmp_path: Path) -> Path:
    """An overlay.json as ``trellis up`` writes it, for an overlay that is not running."""
    work = tmp_path / "overlay"
    work.mkdir()
    links = [["v0", "v1"], ["v1", "v2"], ["v2", "v3"], ["v3", "v4"], ["v4", "v5"]]
    (work / "overlay.json").write_text(json.dumps({"vns": VNS, "links": links, "brokers": []}))
    return work


def test_rebuild_dry_run_moves_the_distrusted_vn_out_of_transit(
    outputs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    work = overlay_dir(tmp_path)
    argv = ["rebuild", "--dir", str(work), "--from", str(outputs), "--dry-run"]
    assert main([*argv, "--epsilon", "0.5"]) == 0
    text = capsys.readouterr().out
    assert "distrusted: v2" in text
    assert "distrusted in transit: v2 -> none" in text
    assert "demoted to leaves: v2" in text
    assert "flagged for detach: none" in text
    assert main([*argv, "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["moves"]
    assert plan["after"]["social_trust"] > plan["before"]["social_trust"]
    assert plan["after"]["cost"] <= plan["budget"]
    assert plan["tree_from"].startswith("the tree it started as")


def test_rebuild_applies_nothing_to_an_overlay_that_is_not_running_and_says_why(
    outputs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    work = overlay_dir(tmp_path)
    assert main(["rebuild", "--dir", str(work), "--from", str(outputs)]) == 1
    out = capsys.readouterr().out
    assert "0/" in out
    assert "nothing applied: the overlay's live tree is not the plan's starting tree" in out
    assert not (work / "rebuild-state.json").exists()


def test_rebuild_plans_from_the_live_links_of_a_running_overlay(
    outputs: Path,
    run_overlay: Callable[..., LocalOverlay],
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Real brokers (a star round v1); the plan starts from the links they report.
    overlay = run_overlay(star_tree([f"v{i}" for i in range(6)], centre="v1"), name="live")
    argv = ["rebuild", "--dir", str(overlay.workdir), "--from", str(outputs), "--dry-run"]
    assert main([*argv, "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["tree_from"] == "live links"
    assert plan["distrusted"] == ["v2"]
    assert plan["demoted"] == []  # v2 is already a leaf of the star: nothing to demote
    assert plan["flagged"] == []
    assert plan["before"]["violations"] == plan["after"]["violations"] == 0
    overlay.stop()
    assert main([*argv, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["tree_from"].startswith("the tree it started as")
