"""``trellis placement plan`` on a local overlay and the analytics job's Parquet outputs.

The outputs are written here with the job's table columns (the contract the command reads);
the overlay is real broker processes. Worked by hand, with ``windows = 1`` keeping only the
window at w = 60:

* classes b0 → [b1, b2]: paths b0→b1 (1 hop) and b0→b2 (2 hops).
* path failures b0→b1 1, b0→b2 3: γ = 1/4, 3/4; ρ = 1/4 and 2 × 3/4 = 3/2 (sum 7/4).
  A budget of 7 gives 7 × (1/4)/(7/4) = 1 and 7 × (3/2)/(7/4) = 6.
* broker failures b1.0 1 (the only one of b1's three replicas), b2 2, b0 none:
  b0→b1's 1 replica goes to b1; b0→b2's 6 split 0 : 1 : 2 over b0, b1, b2 → b1 2, b2 4.
* Plan b0 1, b1 3, b2 4 against the running 1, 3, 1: attach 3 at b2.

The window at w = 0 blames b0 heavily and would change all of that if it were read.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped]
import pyarrow.parquet as pq  # type: ignore[import-untyped]
import pytest

from broker.client import Client
from broker.tools import cli
from broker.tools.local import LocalOverlay, fetch_json, stop_overlay
from overlay.tree import Tree, line_tree

TREE = line_tree(["b0", "b1", "b2"])
REPLICAS = {"b1": 3}


def write_outputs(out: Path) -> Path:
    tables: dict[str, list[dict[str, Any]]] = {
        "classes": [
            {"w": 0.0, "src": "b2", "dsts": ["b0"], "demand": 40},
            {"w": 60.0, "src": "b0", "dsts": ["b1", "b2"], "demand": 5},
        ],
        "path_failures": [
            {"w": 0.0, "src": "b2", "dst": "b0", "publications": 40, "failed": 30},
            {"w": 60.0, "src": "b0", "dst": "b1", "publications": 5, "failed": 1},
            {"w": 60.0, "src": "b0", "dst": "b2", "publications": 5, "failed": 3},
        ],
        "broker_failures": [
            {"w": 0.0, "broker": "b0", "failures": 50, "events": 60},
            {"w": 60.0, "broker": "b0", "failures": 0, "events": 10},
            {"w": 60.0, "broker": "b1.0", "failures": 1, "events": 10},
            {"w": 60.0, "broker": "b1.1", "failures": 0, "events": 10},
            {"w": 60.0, "broker": "b1.2", "failures": 0, "events": 10},
            {"w": 60.0, "broker": "b2", "failures": 2, "events": 10},
        ],
    }
    for name, rows in tables.items():
        (out / name).mkdir(parents=True)
        versioned = [{**r, "version": 1} for r in rows]
        pq.write_table(pa.Table.from_pylist(versioned), out / name / "part-00000.parquet")
    (out / "summary.json").write_text(json.dumps({"version": 1}), encoding="utf-8")
    return out


def write_config(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def plan(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = cli.main(["placement", "plan", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_plan_puts_the_replicas_where_the_failures_were_and_diffs_the_running_overlay(
    run_overlay: Callable[..., LocalOverlay],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    overlay = run_overlay(TREE, replicas=REPLICAS)
    outputs = write_outputs(tmp_path / "analytics")
    config = write_config(tmp_path / "p.toml", "[placement]\nbudget = 7\nwindows = 1\n")
    workdir = str(overlay.workdir)

    code, out, _ = plan(capsys, "--dir", workdir, "--from", str(outputs), "--config", str(config))
    assert code == 0
    assert "b0 -> b2: hops 2 γ 0.750 ω 1 ρ 1.500 → 6 replica(s): b1+2 b2+4" in out
    assert "b0 -> b1: hops 1 γ 0.250 ω 1 ρ 0.250 → 1 replica(s): b1+1" in out
    assert "b2: 1 → 4  attach 3" in out
    assert "b1: 3 → 3  keep" in out
    assert "VN b0 has r = 1 < 3" in out
    assert "no broker runs now" not in out

    code, out, _ = plan(
        capsys, "--dir", workdir, "--from", str(outputs), "--config", str(config), "--json"
    )
    report = json.loads(out)
    assert report["windows"] == [60.0]
    assert report["brokers_running"] == 5
    assert report["tree"] == "live links"
    assert report["plan"]["replicas"] == {"b0": 1, "b1": 3, "b2": 4}
    assert [(d["vn"], d["action"], d["delta"]) for d in report["diff"]] == [
        ("b0", "keep", 0),
        ("b1", "keep", 0),
        ("b2", "attach", 3),
    ]

    # Without the config: every window, and the budget is the 5 brokers that run.
    code, out, _ = plan(capsys, "--dir", workdir, "--from", str(outputs), "--json")
    report = json.loads(out)
    assert report["windows"] == [0.0, 60.0]
    assert report["plan"]["budget"] == 5
    assert sum(report["plan"]["placed"].values()) == 5
    # b2→b0 (30 of the 34 path failures) now dominates, and b0's 50 failures draw replicas.
    assert report["plan"]["placed"]["b0"] > 0


def stopped_overlay(workdir: Path) -> LocalOverlay:
    """An overlay directory as ``trellis up`` leaves it, with no broker running."""
    workdir.mkdir()
    overlay = LocalOverlay(workdir, TREE, replicas=dict(REPLICAS))
    overlay.write_keys()
    overlay.save()
    return overlay


def test_paths_from_the_config_plan_a_stopped_overlay_as_last_started(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    overlay = stopped_overlay(tmp_path / "o")
    config = write_config(
        tmp_path / "p.toml",
        '[placement]\nbudget = 6\npaths = ["b0 -> b2"]\n',
    )
    code, out, _ = plan(capsys, "--dir", str(overlay.workdir), "--config", str(config))
    # No failure data: the one path takes all 6, split evenly over b0, b1, b2.
    assert code == 0
    assert "(no broker runs now: as last started)" in out
    assert "VN tree: as started" in out
    assert "b0: 1 → 2  attach 1" in out
    assert "b1: 3 → 2  detach 1" in out


def test_apply_prints_the_actions_when_no_broker_runs_or_on_a_dry_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    overlay = stopped_overlay(tmp_path / "o")
    config = write_config(tmp_path / "p.toml", '[placement]\nbudget = 6\npaths = ["b0 -> b2"]\n')
    for extra in ([], ["--dry-run"]):
        code = cli.main(
            ["placement", "apply", "--dir", str(overlay.workdir), "--config", str(config), *extra]
        )
        out = capsys.readouterr().out
        assert code == 0
        why = "dry run" if extra else "no broker of the overlay runs"
        assert f"actions ({why}; not applied):" in out
        # attaches first, one replica at a time
        actions = out.split("not applied):")[1].split()
        assert " ".join(actions) == (
            "attach one replica to b0 attach one replica to b2 detach one replica from b1"
        )
    assert json.loads((overlay.workdir / "manifest.json").read_text())["version"] == 0


@pytest.mark.slow
def test_apply_resizes_a_vn_serving_clients_and_its_clients_follow(
    tmp_path: Path,
    run_overlay: Callable[..., LocalOverlay],
) -> None:
    """``apply`` grows b0, which serves a publisher, live: the publisher learns the new
    replica from b0 (``NOTICE membership``), connects to it, and what it publishes after
    still reaches the subscriber at b2."""
    overlay = run_overlay(TREE, replicas=REPLICAS)
    config = write_config(tmp_path / "p.toml", '[placement]\nbudget = 6\npaths = ["b0 -> b2"]\n')

    async def apply_with_clients() -> tuple[subprocess.CompletedProcess[str], int, int, list[int]]:
        async with (
            Client(overlay.endpoints("b0"), client_id="edge") as pub,
            Client(overlay.endpoints("b2"), client_id="far") as far,
            far.subscribe("n >= 0") as sub,
        ):
            await pub.advertise("n >= 0")
            await asyncio.to_thread(overlay.wait_quiet)
            await pub.publish({"n": 0})
            applied = await asyncio.to_thread(
                subprocess.run,
                [sys.executable, "-m", "broker", "placement", "apply", "--dir",
                 str(overlay.workdir), "--config", str(config)],
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )  # fmt: skip
            for n in range(1, 4):
                await pub.publish({"n": n})
            got = [int((await sub.get(10)).attrs["n"]) for _ in range(4)]
            return applied, len(pub.endpoints), pub.vn_size, got

    try:
        applied, endpoints, splits_for, got = asyncio.run(apply_with_clients())
    finally:
        stop_overlay(overlay.workdir)  # the replicas apply started too
    out = applied.stdout
    members = json.loads((overlay.workdir / "manifest.json").read_text())["members"]["b0"]
    assert applied.returncode == 0, applied.stderr[-3000:]
    assert len(members) > 1
    assert "attach b0.1 (b0)" in out
    assert "did not follow" not in out
    assert (endpoints, splits_for) == (len(members), len(members))
    assert got == [0, 1, 2, 3]


def test_plan_errors_say_what_is_missing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = plan(capsys, "--dir", str(tmp_path / "none"))
    assert code == 2
    assert "no overlay in" in err

    overlay = stopped_overlay(tmp_path / "o")
    code, _, err = plan(capsys, "--dir", str(overlay.workdir))
    assert code == 2
    assert "no paths to place replicas on: give --from ANALYTICS_OUT" in err

    code, _, err = plan(capsys, "--dir", str(overlay.workdir), "--from", str(tmp_path))
    assert code == 2
    assert "is not an analytics output (no summary.json)" in err

    bad = write_config(tmp_path / "bad.toml", "[placement]\nbudget = 'lots'\n")
    code, _, err = plan(capsys, "--dir", str(overlay.workdir), "--config", str(bad))
    assert code == 2
    assert f"{bad}: placement.budget: Input should be a valid integer" in err

    unknown = write_config(tmp_path / "u.toml", '[placement]\npaths = ["b0 -> b9"]\n')
    code, _, err = plan(capsys, "--dir", str(overlay.workdir), "--config", str(unknown))
    assert code == 2
    assert "path b0 -> b9: no VN 'b9' in the tree" in err


# -- end to end: a real overlay with an injected fault, the real job, the plan -------------

CORRUPTER = "b1.1"


async def two_classes(overlay: LocalOverlay, count: int) -> int:
    from broker.client import Client

    pub = Client(overlay.endpoints("b0"), client_id="pub")
    at_b2 = Client(overlay.endpoints("b2"), client_id="sub2")
    at_b3 = Client(overlay.endpoints("b3"), client_id="sub3")
    async with (
        pub,
        at_b2,
        at_b3,
        at_b2.subscribe("class = 'q'") as via_b1,
        at_b3.subscribe("class = 'r'") as direct,
    ):
        await pub.advertise("class = 'q'")
        await pub.advertise("class = 'r'")
        await asyncio.to_thread(overlay.wait_quiet)
        for i in range(count):
            await pub.publish({"class": "q", "i": i}, b"x" * 50)
            await pub.publish({"class": "r", "i": i}, b"y" * 50)
        got = 0
        for _ in range(count):
            await via_b1.get(15.0)
            await direct.get(15.0)
            got += 2
        return got


@pytest.mark.slow
def test_plan_from_the_analytics_of_a_run_with_a_corrupting_replica_reinforces_its_vn(
    run_overlay: Callable[..., LocalOverlay],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Tree b2 – b1 – b0 – b3; b1 has 3 replicas and b1.1 corrupts every payload it forwards.
    Class q goes b0 → b1 → b2, class r b0 → b3. Only b0→b2 meets failures (γ = 1, b0→b3
    γ = 0), and on it only b1's brokers fail, so the whole budget of 6 lands on b1: 3 → 6."""
    pytest.importorskip("pyspark")
    logs, out = tmp_path / "traffic", tmp_path / "out"
    tree = Tree(["b0", "b1", "b2", "b3"], [("b0", "b1"), ("b1", "b2"), ("b0", "b3")])
    overlay = run_overlay(
        tree,
        replicas={"b1": 3},
        overrides={CORRUPTER: {"byzantine": "corrupt"}},
        traffic_log={"dir": str(logs), "flush_interval": 0.2},
        reconfig={"interval": 3600.0},
    )
    assert asyncio.run(two_classes(overlay, 20)) == 40
    overlay.wait_quiet()
    overlay.stop()  # a graceful stop writes every broker's last batch
    done = subprocess.run(
        [sys.executable, "-m", "broker", "analytics", "run", "--logs", str(logs), "--out",
         str(out), "--window", "1e9", "--master", "local[2]", "--json"],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    config = write_config(tmp_path / "p.toml", "[placement]\nbudget = 6\n")

    code, text, err = plan(
        capsys, "--dir", str(overlay.workdir), "--from", str(out), "--config", str(config), "--json"
    )
    assert code == 0, err
    report = json.loads(text)
    paths = {tuple(p["path"]): p for p in report["plan"]["paths"]}
    assert set(paths) == {("b0", "b2"), ("b0", "b3")}
    assert paths[("b0", "b2")]["gamma"] == 1.0
    assert paths[("b0", "b3")]["gamma"] == 0.0
    assert report["plan"]["placed"] == {"b0": 0, "b1": 6, "b2": 0, "b3": 0}
    assert [(d["vn"], d["action"], d["delta"]) for d in report["diff"]] == [
        ("b0", "keep", 0),
        ("b1", "attach", 3),
        ("b2", "keep", 0),
        ("b3", "keep", 0),
    ]

    # `placement apply` makes it so, live: the brokers run again (same ports, the same
    # manifest), and b1 grows to 6 replicas while they run.
    for broker_id in overlay.broker_ids:
        overlay.start(broker_id)
    try:
        overlay.wait_linked()
        applied = subprocess.run(
            [sys.executable, "-m", "broker", "placement", "apply", "--dir",
             str(overlay.workdir), "--from", str(out), "--config", str(config)],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )  # fmt: skip
        assert applied.returncode == 0, applied.stderr[-3000:]
        lines = applied.stdout.splitlines()
        done_lines = [line.split()[:2] for line in lines if "manifest version" in line]
        assert done_lines == [["attach", "b1.3"], ["attach", "b1.4"], ["attach", "b1.5"]]
        info = json.loads((overlay.workdir / "overlay.json").read_text())
        assert info["vns"]["b1"] == [f"b1.{i}" for i in range(6)]
        admins = {b["id"]: b["admin"] for b in info["brokers"]}
        for new in ("b1.3", "b1.4", "b1.5"):
            health = fetch_json(admins[new] + "/healthz")
            assert set(health["links"]) == {"b0", "b2"}, health
        assert fetch_json(admins["b0"] + "/healthz")["manifest_version"] == 6
        # Traffic through b1 (now 6 replicas, one still corrupting) arrives, and the plan
        # has nothing left to do.
        assert asyncio.run(two_classes(overlay, 10)) == 20
        code, text, err = plan(
            capsys, "--dir", str(overlay.workdir), "--from", str(out), "--config", str(config),
            "--json",
        )  # fmt: skip
        assert code == 0, err
        assert {d["vn"]: d["action"] for d in json.loads(text)["diff"]}["b1"] == "keep"
    finally:
        stop_overlay(overlay.workdir)


def test_a_compose_keys_dir_without_compose_is_refused_naming_the_option(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``compose_gen.py keys`` output (manifest, ca/, tls/, no overlay.json) is a compose
    deployment's keys dir: read as a local overlay it would look like one with no broker
    running, and apply would only print actions, so the command says which option it needs."""
    from tests.test_deploy import load_compose_gen

    keys = tmp_path / "keys"
    load_compose_gen().write_keys(keys)
    config = write_config(tmp_path / "p.toml", '[placement]\nbudget = 9\npaths = ["b0 -> b2"]\n')
    for command in ("plan", "apply"):
        code = cli.main(["placement", command, "--dir", str(keys), "--config", str(config)])
        err = capsys.readouterr().err
        assert code == 2
        assert "is a compose deployment's keys dir" in err
        assert "--compose FILE" in err
    assert json.loads((keys / "manifest.json").read_text())["version"] == 0
