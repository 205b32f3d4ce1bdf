"""``trellis topic`` and ``pub``/``sub --identity --grant`` against a broker with secured
topics and a TDN, as a person would use them."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from broker.tools.launcher import BrokerProcess
from broker.tools.tdn import start_tdn_process
from security.envelope import Signer, public_key_to_bytes
from tests.support import trellis

pytestmark = pytest.mark.slow


def test_an_owner_creates_delegates_and_publishes_and_only_the_delegate_may_subscribe(
    tmp_path: Path, run_broker: Callable[..., BrokerProcess]
) -> None:
    tdn = Signer.generate("tdn-1")
    trusted = tmp_path / "tdns.json"
    trusted.write_text(json.dumps({"tdn-1": public_key_to_bytes(tdn.public_key).hex()}))
    broker = run_broker("b1", topic_trust=str(trusted))
    proc = start_tdn_process(tmp_path, tdn, broker.endpoint, trusted)
    try:
        ids = {}
        for name in ("owner", "reader", "other"):
            out = trellis("topic", "identity", str(tmp_path / f"{name}.json"), "--new", name)
            assert out.returncode == 0, out.stderr
            ids[name] = json.loads(out.stdout)["principal"]
        common = ["--endpoint", broker.endpoint, "--trusted", str(trusted)]
        owner = ["--identity", str(tmp_path / "owner.json")]
        out = trellis(
            "topic",
            "create",
            *common,
            *owner,
            "orders/eu",
            "--lifetime",
            "600",
            "--property",
            "kind='orders',region='eu'",
            "--out",
            str(tmp_path / "owner.grant"),
        )
        assert out.returncode == 0, out.stderr
        topic = json.loads(out.stdout)["uuid"]
        out = trellis(
            "topic",
            "discover",
            *common,
            "--identity",
            str(tmp_path / "other.json"),
            "--where",
            "kind = 'orders'",
        )
        assert [json.loads(line)["uuid"] for line in out.stdout.splitlines()] == [topic]
        out = trellis(
            "topic",
            "delegate",
            *owner,
            "--grant",
            str(tmp_path / "owner.grant"),
            "--holder",
            str(tmp_path / "reader.json"),
            "--right",
            "subscribe",
            "--out",
            str(tmp_path / "reader.grant"),
        )
        assert out.returncode == 0, out.stderr

        flt = f"class = 'Secured/{topic}'"
        refused = trellis(
            "sub",
            "--endpoint",
            broker.endpoint,
            "--identity",
            str(tmp_path / "other.json"),
            flt,
            "--count",
            "1",
            "--timeout",
            "5",
        )
        assert refused.returncode == 2
        assert "needs the topic's advertisement and a delegation" in refused.stderr
        ready = tmp_path / "sub.ready"
        sub = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "broker",
                "sub",
                "--endpoint",
                broker.endpoint,
                "--identity",
                str(tmp_path / "reader.json"),
                "--grant",
                str(tmp_path / "reader.grant"),
                flt,
                "--count",
                "1",
                "--timeout",
                "20",
                "--json",
                "--ready-file",
                str(ready),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            deadline = time.monotonic() + 20
            while not ready.exists() and sub.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
            out = trellis(
                "pub",
                "--endpoint",
                broker.endpoint,
                *owner,
                "--grant",
                str(tmp_path / "owner.grant"),
                "--attrs",
                f"class='Secured/{topic}',n=1",
                "--payload",
                "hello",
            )
            assert out.returncode == 0, out.stderr
            stdout, stderr = sub.communicate(timeout=30)
        finally:
            if sub.poll() is None:
                sub.kill()
                sub.wait(5)
        assert sub.returncode == 0, stderr
        got = json.loads(stdout.splitlines()[0])
        assert (got["payload"], got["publisher"]) == ("hello", "owner")
    finally:
        proc.terminate()
        proc.wait(10)
