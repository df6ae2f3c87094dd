"""The network simulator as one subsystem: the engine reaches it through one object
(gossip.network.Simulator, built by gossip.network.build), and the package sits between the
core and the engine (it imports neither the engine nor anything above it)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

import gossip
import topologies
from gossip import Engine, make_algorithm
from gossip.errors import ConfigError
from gossip.network import Simulator, build, parse_network

PACKAGE = Path(gossip.__file__).parent
ABOVE = ("gossip.engine", "gossip.algorithms", "gossip.training", "gossip.runner", "gossip.wrap",
         "gossip.cli", "gossip.tuning", "gossip.metrics")
"""The layers above the network: what drives it, and what is built on the engine."""


def imported_modules(path: Path) -> set[str]:
    """Every module ``path`` imports: at its top, inside a function or for type checking only
    (absolute names)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def _importers(paths: list[Path], targets: tuple[str, ...]) -> list[str]:
    return sorted(f"{p.relative_to(PACKAGE)} -> {m}" for p in paths for m in imported_modules(p)
                  if any(m == t or m.startswith(t + ".") for t in targets))


def test_the_network_imports_nothing_above_it():
    network = sorted((PACKAGE / "network").glob("*.py"))
    assert len(network) >= 8  # the subsystem itself, not an empty selection
    assert not _importers(network, ABOVE)


def test_the_core_does_not_import_the_network():
    core = sorted((PACKAGE / "core").glob("*.py"))
    assert core and not _importers(core, ("gossip.network",))


def _engine(network, name: str = "gossip", **kwargs) -> Engine:
    x0 = lambda i: torch.arange(4, dtype=torch.float64) * i  # noqa: E731
    return Engine(make_algorithm(name), topologies.build("ring", 6), x0, network=network, **kwargs)


def test_an_ideal_network_adds_nothing_to_the_rounds():
    engine = _engine(None)
    net = engine.network
    assert isinstance(net, Simulator) and net.model == parse_network("none")
    assert (net.clock, net.wall, net.delivery, net.stale, net.events) == (None,) * 5
    assert not net.runs_free and net.fields() == {} and net.start_fields() == {}
    rec = engine.run(3)[-1]
    assert not {"messages_lost", "messages_late", "time_virtual_s", "wall_s"} & set(rec)


def test_the_engine_reaches_loss_lateness_and_time_through_one_object():
    spec = "loss=0.3;stale=1;compute=exp:1"
    for network in (spec, parse_network(spec)):  # a spec or a parsed Network
        engine = _engine(network)
        net = engine.network
        assert net.model.spec() == parse_network(spec).spec()
        assert net.delivery is not None and net.stale is not None and net.clock is not None
        rec = engine.run(6)[-1]
        assert rec["messages_lost_total"] == int(net.delivery.lost_total.sum()) > 0
        assert rec["messages_late_total"] == int(net.stale.late_total.sum()) > 0
        assert rec["time_virtual_s"] == net.clock.time(6) > 0


def test_an_asynchronous_algorithm_runs_on_the_network_s_event_loop():
    engine = _engine("compute=exp:1", name="gossip-learning")
    assert engine.network.events is not None and engine.network.clock is None
    engine.run(2)
    assert engine.network.events.activations == 2 * 6


def test_build_refuses_before_any_node_exists():
    topo = topologies.build("ring", 6)
    with pytest.raises(ConfigError, match="churn"):
        build("churn=rate:0.1,mean_away:1", algorithm=make_algorithm("gossip"), topology=topo,
              seed=0)
    with pytest.raises(ConfigError, match="node 9"):
        build("slow=nodes:9x2", algorithm=make_algorithm("gossip"), topology=topo, seed=0)
    with pytest.raises(ConfigError, match="delay="):
        build("delay=1", algorithm=make_algorithm("gossip"), topology=topo, seed=0, free_run=0.1)
