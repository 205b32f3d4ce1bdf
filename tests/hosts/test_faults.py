"""Short versions of the fault scenarios on hosts with their own addresses (the full ones:
``python -m tests.hosts``). Each runs nine brokers in network namespaces: a line of three
VNs of three replicas, a publisher at one end and a subscriber at the other."""

from __future__ import annotations

import pytest

from tests.hosts.scenarios import Tally, run_scenario

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("hosts_available")]


def _exact(tally: Tally) -> None:
    assert tally.published > 100
    assert tally.refused == 0
    assert (tally.lost, tally.duplicated, tally.reordered, tally.altered) == (0, 0, 0, 0)
    assert tally.decrypted == tally.confidential > 0


def test_killing_f_replicas_per_vn_and_restarting_them_loses_nothing() -> None:
    _exact(run_scenario("kill"))


def test_a_ten_second_partition_between_vns_is_buffered_and_replayed() -> None:
    tally = run_scenario("partition")
    _exact(tally)
    # What a partition holds back is bounded by the links' send buffers (4 MiB each).
    assert tally.peak_rss_growth_kib < 64 * 1024
    assert tally.fd_growth <= 2


def test_five_percent_loss_and_fifty_ms_jitter_on_every_link_lose_nothing() -> None:
    _exact(run_scenario("netem"))


def test_a_whole_vn_restart_loses_only_what_was_published_while_it_was_down() -> None:
    """Beyond f failed replicas nothing is promised for the outage: the publications routed
    through the VN while it is down are lost (counted here). Delivery resumes once it is
    back, in order, without duplicates."""
    tally = run_scenario("vn-restart")
    assert tally.published > 100
    assert (tally.duplicated, tally.reordered, tally.altered) == (0, 0, 0)
    assert tally.fault_over is not None
    late = [s for s, t in tally.published_at.items() if t > tally.fault_over + 3.0]
    assert late
    assert all(s in tally.arrived_at for s in late)
