"""An asynchronous run either makes progress or is refused (gossip/network/events.py): rate
churn that leaves a node present too rarely, or flips it too often, is refused before the first
event, and the event loop stops whatever else would spin without an activation."""

from __future__ import annotations

import time

import pytest
import torch

import topologies
from gossip.algorithms import make_algorithm
from gossip.cli import guarded
from gossip.engine import Engine
from gossip.errors import ConfigError
from gossip.network import events, parse_network
from tests.helpers.launch import script


def test_the_churn_that_hung_ad_psgd_is_refused_at_once(capsys):
    """Nodes up 1 ms, away 1000 s on average: present a millionth of the time. The run used
    to step through away nodes' clock rings forever, printing nothing."""
    optimize = script("optimize")
    start = time.monotonic()
    with pytest.raises(SystemExit) as exc:
        guarded(lambda: optimize.main(["--algorithm", "ad-psgd", "--nodes", "4", "--dim", "8",
                                       "--iterations", "50", "--network",
                                       "churn=rate:1000,mean_away:1000"]))
    assert exc.value.code == 2
    out = str(exc.value.code) + capsys.readouterr().err
    assert "churn=rate:1000,mean_away:1000" in out and "1e-06 of the time" in out, out
    assert time.monotonic() - start < 10


@pytest.mark.parametrize(("spec", "needle"), [
    ("churn=rate:1000,mean_away:1000", "1e-06 of the time"),
    ("churn=rate:2,mean_away:500", "0.000999 of the time"),
])
def test_rate_churn_that_leaves_nodes_present_too_rarely_is_refused_when_parsed(spec, needle):
    with pytest.raises(ConfigError, match=needle):
        parse_network(spec)
    assert parse_network("churn=rate:1,mean_away:999").churn.present_fraction == 1e-3


def _engine(network, n=4):
    return Engine(make_algorithm("pairwise-gossip"), topologies.build("ring", n),
                  lambda i: torch.full((3,), float(i), dtype=torch.float64), network=network)


def test_rate_churn_that_flips_nodes_too_often_is_refused_before_the_first_event():
    engine = _engine("churn=rate:1e9,mean_away:1e-9")
    start = time.monotonic()
    with pytest.raises(ConfigError, match=r"leave and come back about 2.5e\+09 times"):
        engine.run(5)
    assert time.monotonic() - start < 2 and engine.network.events.activations == 0


def test_the_event_loop_stops_when_no_node_is_activated_for_too_long(monkeypatch):
    """Up 2 s, away 200 s on average (allowed: present 1% of the time): once every node is
    away, hundreds of clock rings pass without an activation; with the bound lowered to 50 the
    loop stops there with the model named, instead of spinning."""
    monkeypatch.setattr(events, "IDLE_EVENTS", 50)
    engine = _engine("churn=rate:0.5,mean_away:200", n=2)
    with pytest.raises(ConfigError, match=r"churn=rate:0.5,mean_away:200: 50 events in a row "
                                          r"\(virtual time .* activated no node"):
        engine.run(200)
    monkeypatch.setattr(events, "IDLE_EVENTS", 10**6)  # the default bound: the run finishes
    engine = _engine("churn=rate:0.5,mean_away:200", n=2)
    assert engine.run(20)[-1]["activations"] == 40
