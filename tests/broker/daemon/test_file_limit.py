"""A broker raises its open-file soft limit to the hard limit: one descriptor per connection."""

from __future__ import annotations

import subprocess
import sys

import pytest

SCRIPT = """
import resource
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (64, hard))
from broker.daemon.server import raise_file_limit
print(raise_file_limit(), resource.getrlimit(resource.RLIMIT_NOFILE)[0], hard)
"""


def test_a_broker_process_raises_its_open_file_limit_to_the_hard_limit() -> None:
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60, check=True
    ).stdout.split()
    returned, soft, hard = (int(v) for v in out)
    if hard <= 64:
        pytest.fail(f"this machine's hard limit ({hard}) leaves nothing to raise")
    assert returned == soft > 64
