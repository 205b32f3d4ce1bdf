"""Multi-host tests skip, with the reason, where network namespaces cannot be made."""

from __future__ import annotations

import pytest

from tests.hosts.net import HostsUnavailable, check_available


@pytest.fixture(scope="session")
def hosts_available() -> None:
    try:
        check_available()
    except HostsUnavailable as exc:
        pytest.skip(f"multi-host tests need network namespaces: {exc}")
