"""The admin page in a real headless Chromium against a running overlay (issue 16).

The browser is Debian's ``chromium``, driven over the DevTools protocol on a pipe
(``--remote-debugging-pipe``: NUL-separated JSON on fds 3 and 4), so no websocket client and
no downloaded browser are needed. The page is opened on a broker that is on no publication's
path; it finds the other brokers' admin ports itself (``/api/topology``). The test checks the
drawing in the DOM: every VN, replica and link; a traced publication's path; and the new
link after a live reconfiguration round. A screenshot goes to the test's directory.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import select
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from broker.client import Client
from broker.tools.local import LocalOverlay, fetch_json
from overlay.tree import line_tree

pytestmark = pytest.mark.slow

RECONFIG = {"enabled": True, "interval": 0.3, "jitter": 0.3, "min_traffic": 15}


class DevToolsError(RuntimeError):
    """Chromium did not start, or a DevTools call failed or timed out."""


class Browser:
    """A headless Chromium process and one page in it, driven over the DevTools pipe."""

    def __init__(self, executable: str, profile: Path) -> None:
        to_child, self._out = os.pipe()  # we write commands; Chromium reads fd 3
        self._in, from_child = os.pipe()  # Chromium writes answers on fd 4; we read
        # Chromium reads fd 3 and writes fd 4: move the pipe ends there in the child.
        high_r, high_w = os.dup(to_child), os.dup(from_child)

        def place_fds() -> None:
            os.dup2(high_r, 3)
            os.dup2(high_w, 4)

        self._log = (profile.parent / "chromium.log").open("wb")
        self.process = subprocess.Popen(
            [
                executable,
                "--headless=new",
                "--no-sandbox",  # root in CI containers; it only opens our localhost page
                "--disable-gpu",
                "--no-first-run",
                "--no-default-browser-check",
                "--remote-debugging-pipe",
                f"--user-data-dir={profile}",
                "--window-size=1280,1000",
                "about:blank",
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=self._log,
            # Kept open past the child's close_fds, which runs after preexec_fn.
            pass_fds=(3, 4, high_r, high_w),
            preexec_fn=place_fds,  # noqa: PLW1509 - only dup2 before exec
        )
        for fd in (to_child, from_child, high_r, high_w):
            os.close(fd)
        self._buffer = b""
        self._next_id = 0
        self.session = ""

    def call(
        self, method: str, params: dict[str, Any] | None = None, timeout: float = 10.0
    ) -> dict[str, Any]:
        """One DevTools command (to the page once attached); its result."""
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if self.session and not method.startswith(("Target.", "Browser.")):
            message["sessionId"] = self.session
        os.write(self._out, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            while b"\0" in self._buffer:
                raw, self._buffer = self._buffer.split(b"\0", 1)
                answer = json.loads(raw)
                if answer.get("id") == self._next_id:
                    if "error" in answer:
                        raise DevToolsError(f"{method}: {answer['error']}")
                    result: dict[str, Any] = answer["result"]
                    return result
            left = deadline - time.monotonic()
            if left <= 0 or self.process.poll() is not None:
                raise DevToolsError(f"{method}: no answer within {timeout:g} s")
            ready, _, _ = select.select([self._in], [], [], min(left, 0.5))
            if ready:
                chunk = os.read(self._in, 1 << 20)
                if not chunk:
                    raise DevToolsError(f"{method}: Chromium closed the pipe")
                self._buffer += chunk

    def open(self, url: str) -> None:
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        attached = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})
        self.session = attached["sessionId"]
        self.call("Page.enable")
        self.call("Page.navigate", {"url": url})

    def evaluate(self, expression: str) -> Any:
        answer = self.call(
            "Runtime.evaluate",
            {"expression": expression, "returnByValue": True, "awaitPromise": True},
        )
        if "exceptionDetails" in answer:
            raise DevToolsError(f"{expression}: {answer['exceptionDetails']}")
        return answer["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 10.0) -> Any:
        """Poll a JavaScript expression until it is truthy; its value."""
        deadline = time.monotonic() + timeout
        while True:
            with contextlib.suppress(DevToolsError):  # the page may be between loads
                value = self.evaluate(expression)
                if value:
                    return value
            if time.monotonic() > deadline:
                raise AssertionError(f"page never satisfied {expression!r} in {timeout:g} s")
            time.sleep(0.1)

    def screenshot(self, path: Path) -> None:
        data = self.call("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True})
        path.write_bytes(base64.b64decode(data["data"]))

    def close(self) -> None:
        with contextlib.suppress(DevToolsError, OSError):
            self.call("Browser.close", timeout=3)
        try:
            self.process.wait(5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(5)
        os.close(self._out)
        os.close(self._in)
        self._log.close()


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Browser]:
    """Headless Chromium, or a skip saying why there is none on this machine."""
    executable = shutil.which("chromium") or shutil.which("chromium-browser")
    if executable is None:
        pytest.skip("no chromium on PATH (deploy/setup.sh installs Debian's chromium package)")
    started = Browser(executable, tmp_path / "chromium-profile")
    try:
        started.call("Browser.getVersion", timeout=20)
    except DevToolsError as exc:
        started.close()
        log = (tmp_path / "chromium.log").read_text(errors="replace")[-2000:]
        pytest.skip(f"chromium did not start headless: {exc}; its log ends: {log}")
    yield started
    started.close()


DRAWN_VNS = "[...document.querySelectorAll('#overlay g.vn')].map(g => g.dataset.vn).sort()"
DRAWN_BROKERS = (
    "[...document.querySelectorAll('#overlay circle.replica')]"
    ".map(c => c.dataset.broker + ':' + c.dataset.up).sort()"
)
DRAWN_LINKS = "[...document.querySelectorAll('#overlay line.link')].map(l => l.dataset.link).sort()"


def link_keys(links: Any) -> list[str]:
    return sorted("|".join(sorted(link)) for link in links)


async def test_admin_page_draws_the_overlay_traces_a_publication_and_follows_a_round(
    run_overlay: Callable[..., LocalOverlay], browser: Browser, tmp_path: Path
) -> None:
    overlay = run_overlay(
        line_tree(["b0", "b1", "b2", "b3"]),
        replicas={"b1": 3},
        heartbeat_interval=1.0,
        reconfig=RECONFIG,
    )
    async with (
        Client(overlay.endpoints("b0"), client_id="pub") as pub,
        Client(overlay.endpoints("b2"), client_id="sub") as sc,
        sc.subscribe("class = 'x'") as sub,
    ):
        await pub.advertise("class = 'x'")
        await asyncio.to_thread(overlay.wait_quiet)
        for i in range(5):  # fewer than min_traffic: no round moves anything yet
            await pub.publish({"class": "x", "i": i}, b"before")
        assert [(await sub.get(10)).seq for _ in range(5)] == [1, 2, 3, 4, 5]

        # b3 is on no publication's path; its page finds every broker by itself.
        await asyncio.to_thread(browser.open, overlay.brokers["b3"].admin_url + "/")
        before = link_keys(overlay.tree.links)
        assert before == ["b0|b1", "b1|b2", "b2|b3"]
        wait = browser.wait_for
        expected_brokers = sorted(f"{b}:true" for b in overlay.broker_ids)
        assert await asyncio.to_thread(
            wait, f"{DRAWN_BROKERS}.join() === {json.dumps(','.join(expected_brokers))}"
        )
        assert browser.evaluate(DRAWN_VNS) == ["b0", "b1", "b2", "b3"]
        assert browser.evaluate(DRAWN_LINKS) == before
        forwarded = browser.evaluate(
            "Object.fromEntries([...document.querySelectorAll('#overlay text.traffic')]"
            ".map(t => [t.dataset.link, Number(t.dataset.total)]))"
        )
        # b0 sent 5 to b1; each of b1's 3 replicas sent 5 to b2; nothing went to b3.
        assert forwarded == {"b0|b1": 5, "b1|b2": 15, "b2|b3": 0}

        browser.evaluate(
            "document.getElementById('trace-publisher').value = 'pub';"
            "document.getElementById('trace-seq').value = '3';"
            "document.getElementById('trace-go').click(); true"
        )
        path = await asyncio.to_thread(wait, "document.getElementById('trace-result').dataset.path")
        assert path == "b0,b1,b2"
        steps = browser.evaluate(
            "[...document.querySelectorAll('#trace-result li')]"
            ".map(li => li.dataset.broker + ':' + li.dataset.what)"
        )
        assert steps == [
            "b0:forwarded",
            "b1.0:forwarded",
            "b1.1:forwarded",
            "b1.2:forwarded",
            "b2:delivered",
        ]
        traced = DRAWN_LINKS.replace("line.link", "line.link.traced")
        assert await asyncio.to_thread(wait, f"{traced}.length === 2")
        assert browser.evaluate(traced) == ["b0|b1", "b1|b2"]

        # Traffic from b0 to b2 across b1: a round links b0 to b2 directly (see
        # test_reconfig_live); the page must redraw without a reload.
        sent = 5
        deadline = time.monotonic() + 25
        while not await asyncio.to_thread(applied, overlay):
            assert time.monotonic() < deadline, "no reconfiguration round applied a move"
            for _ in range(20):
                sent += 1
                await pub.publish({"class": "x"}, b"p", ack=False)
            await pub.drain()
            await asyncio.sleep(0.05)
        after = link_keys((await asyncio.to_thread(overlay.live_tree)).links)
        assert after != before
        polls = int(browser.evaluate("document.body.dataset.polls"))
        assert await asyncio.to_thread(
            wait, f"{DRAWN_LINKS}.join() === {json.dumps(','.join(after))}", 10
        )
        assert int(browser.evaluate("document.body.dataset.polls")) > polls  # redrawn live
        outcomes = await asyncio.to_thread(
            wait,
            "[...document.querySelectorAll('#rounds tbody tr')]"
            ".map(tr => tr.dataset.outcome).filter(o => o === 'applied')",
        )
        assert outcomes
        shot = tmp_path / "admin-page.png"
        await asyncio.to_thread(browser.screenshot, shot)
        assert shot.read_bytes().startswith(b"\x89PNG")
        for _ in range(sent - 5):
            await sub.get(10)


def applied(overlay: LocalOverlay) -> int:
    return sum(fetch_json(p.admin_url + "/reconfig")["applied"] for p in overlay.brokers.values())
