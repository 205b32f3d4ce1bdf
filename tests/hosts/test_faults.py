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


def test_a_publisher_flooding_into_a_partition_is_held_back_not_dropped() -> None:
    """500 publications of 4 KiB per second offered into a 10 s partition: the links' send
    buffers fill, the edge brokers stop reading from the publisher, its publish() waits;
    memory stays bounded and nothing is lost once the partition heals."""
    tally = run_scenario("flood-partition")
    assert tally.published > 1000
    assert tally.refused == 0
    assert (tally.lost, tally.duplicated, tally.reordered, tally.altered) == (0, 0, 0, 0)
    during = tally.rate_during_fault
    assert during is not None
    assert during < 450  # held back: 500/s for 10 s is more than the links buffer
    assert tally.peak_rss_growth_kib < 64 * 1024


def test_a_partition_past_the_heartbeat_deadline_loses_only_until_the_heal() -> None:
    """Links silent past the deadline are closed (and what they held is lost); once the
    partition heals they are re-dialled at once, not when TCP's back-off would have let the
    old connection finish closing."""
    tally = run_scenario("long-partition")
    assert (tally.duplicated, tally.reordered, tally.altered) == (0, 0, 0)
    assert tally.fault_start is not None
    assert tally.fault_over is not None
    lost_at = [t for s, t in tally.published_at.items() if s not in tally.arrived_at]
    assert lost_at, "nothing lost: the links were not closed, the test proves nothing"
    assert max(lost_at) < tally.fault_over + 6.0
    assert min(lost_at) > tally.fault_start - 1.0


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
