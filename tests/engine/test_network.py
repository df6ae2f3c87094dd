"""Message loss (gossip.network, gossip.network.loss): spec parsing, drop frequencies, semantics."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import topologies
from gossip import Engine, make_algorithm
from gossip.errors import ConfigError
from gossip.network import GilbertElliott, LossDraws, arc_keys, parse_network

ARCS = arc_keys([(i, j) for i in range(50) for j in range(50) if i != j])


@pytest.mark.parametrize("spec", ["loss=1.5", "loss=-0.1", "loss=nan", "loss=ge:p_gb=0.1",
                                  "loss=foo:0.1", "jitter=2", "loss", "loss=0.1;loss=0.2"])
def test_bad_specs_give_one_error_line(spec):
    with pytest.raises(ConfigError) as err:
        parse_network(spec)
    assert "\n" not in str(err.value)


def test_bernoulli_drops_within_binomial_bounds():
    draws = LossDraws(parse_network("loss=0.1").loss, 7, ARCS)
    k = sum(int(draws.lost(t, 0).sum()) for t in range(1, 41))
    n = 40 * len(ARCS)
    assert abs(k - 0.1 * n) < 5 * math.sqrt(n * 0.1 * 0.9)


def test_gilbert_elliott_stationary_rate():
    ge = parse_network("loss=ge:p_gb=0.05,p_bg=0.5,loss_bad=0.8").loss
    assert isinstance(ge, GilbertElliott)
    draws = LossDraws(ge, 7, ARCS)
    k = sum(int(draws.lost(t, 0).sum()) for t in range(1, 201))
    n = 200 * len(ARCS)
    lam = 1 - ge.p_gb - ge.p_bg  # chain correlation inflates the variance by (1+λ)/(1−λ)
    sigma = math.sqrt(n * ge.rate * (1 - ge.rate) * (1 + lam) / (1 - lam) * 2)
    assert abs(k - ge.rate * n) < 5 * sigma
    fresh = LossDraws(ge, 7, ARCS)  # replayed from round 0: the same drops
    assert np.array_equal(fresh.lost(200, 0), draws.lost(200, 0))


def test_no_loss_is_the_ideal_run():
    topo = topologies.build("ring", 8)
    x0 = lambda i: torch.arange(5, dtype=torch.float64) * i  # noqa: E731
    runs = []
    for net in (None, "none", "loss=0"):
        e = Engine(make_algorithm("choco", gamma=0.5), topo, x0, compressor="topk:0.4", network=net)
        assert e.network.delivery is None
        e.run(10)
        runs.append(torch.stack([nd.x for nd in e.nodes.values()]))
    assert all(torch.equal(runs[0], r) for r in runs)


def test_push_sum_keeps_mass_and_gossip_average_drifts():
    topo = topologies.build("directed-random:p=0.3", 8, weights="push", seed=3)
    x0 = lambda i: torch.full((4,), float(i), dtype=torch.float64)  # noqa: E731
    e = Engine(make_algorithm("push-sum"), topo, x0, network="loss=0.3")
    e.run(200)
    st = e.block.state
    assert abs(float(st["w"].sum()) - 8) < 1e-12
    assert torch.allclose(e.block.x, torch.full_like(e.block.x, 3.5), atol=1e-8)
    g = Engine(make_algorithm("gossip"), topologies.build("ring", 8), x0, network="loss=0.3")
    g.run(200)
    assert abs(float(g.mean_model()[0]) - 3.5) > 1e-3  # row- but not column-stochastic


def test_refused_without_loss_semantics():
    topo = topologies.build("ring", 8)
    with pytest.raises(ConfigError):
        Engine(make_algorithm("push-sum"), topologies.build("ring", 8, weights="push"),
               lambda i: torch.zeros(4), compressor="topk:0.5", network="loss=0.1")
    with pytest.raises(ConfigError, match="no defined meaning for a lost message") as info:
        Engine(make_algorithm("ecd"), topo, lambda i: torch.zeros(16), network="loss=0.1")
    assert "-arcs" not in str(info.value)  # ECD has no per-arc form to point to


def test_a_refusal_under_loss_points_to_the_methods_own_per_arc_form():
    """A method that declares a per-arc form but no meaning for a lost message (a user's
    plug-in) is pointed to that form, which then runs under the same loss."""
    from gossip.algorithms.choco import Choco

    class NoLossChoco(Choco):
        name = "no-loss-choco"
        on_loss = None
        arcs_form = Choco.arcs_form

    topo, x0 = topologies.build("ring", 8), lambda i: torch.full((4,), float(i))
    with pytest.raises(ConfigError, match="per-arc form no-loss-choco-arcs"):
        Engine(NoLossChoco(), topo, x0, compressor="topk:0.5", network="loss=0.1")
    Engine(NoLossChoco.with_arcs()(), topo, x0, compressor="topk:0.5", network="loss=0.1").run(2)


def test_an_arc_phase_is_delivered_without_its_lost_arcs():
    """choco-arcs' per-arc phase: the masks are the draws of (seed, arc, round, phase) of the
    block's own arcs (sender side) and of its in-arcs (receiver side); a lost arc moves no
    bytes and counts as lost at its receiver."""
    from gossip.network import LossDraws

    eng = Engine(make_algorithm("choco-arcs", gamma=0.3), topologies.build("ring", 8),
                 lambda i: torch.zeros(4, dtype=torch.float64), compressor="topk:0.5",
                 network="loss=0.3", seed=5)
    route = eng.block.arc_plan()  # the round's per-arc phase
    model = eng.network.model.loss
    for t in (1, 7):
        plan = eng.network.delivery.route(route, eng.topology, t, 0)
        out = LossDraws(model, 5, arc_keys(route.arcs)).lost(t, 0)
        into = LossDraws(model, 5, arc_keys(route.incoming)).lost(t, 0)
        assert out.any() and plan is not route
        assert plan.out_delivered.tolist() == (~out).tolist()
        assert plan.in_delivered.tolist() == (~into).tolist()
        assert plan.out_degree == [int(not lost) for lost in out]
        assert plan.arcs == route.arcs and plan.incoming == route.incoming  # every row kept
    assert eng.network.delivery.lost_total.sum() == sum(
        int(LossDraws(model, 5, arc_keys(route.incoming)).lost(t, 0).sum()) for t in (1, 7))


def test_ack_needs_arc_phases():
    from gossip.algorithms.gossip import Gossip

    class AckGossip(Gossip):
        """Gossip claiming it reads per-arc deliveries while it broadcasts."""

        name = "ack-gossip"
        on_loss = "ack"

    eng = Engine(AckGossip(), topologies.build("ring", 8), lambda i: torch.ones(3),
                 network="loss=0.5")
    with pytest.raises(ConfigError, match="sends one message per node: send it per arc"):
        eng.run(3)


def test_edge_loss_on_a_broadcast_is_a_symmetric_doubly_stochastic_mix():
    """on_loss "edge" on a per-node phase: an edge either of whose messages is lost leaves the
    round's W at both ends (its weight to both own terms). Gossip with it equals a float64
    replay of those W_t and keeps the average exactly (W_t doubly stochastic)."""
    from gossip.algorithms.gossip import Gossip

    class EdgeGossip(Gossip):
        """Gossip whose lost messages drop their edges at both ends."""

        name = "edge-gossip"
        on_loss = "edge"

    topo = topologies.build("erdos-renyi:p=0.4", 8, seed=7)
    W = torch.from_numpy(topo.dense())
    x0 = lambda i: torch.randn(6, generator=torch.Generator().manual_seed(i),  # noqa: E731
                               dtype=torch.float64)
    eng = Engine(EdgeGossip(), topo, x0, network="loss=0.3", seed=2)
    X = eng.block.x.clone()
    mean0 = X.mean(0)
    model = eng.network.model.loss
    for t in range(1, 31):
        Wt = W.clone()
        for i in range(8):
            for j in topo.view(i).neighbors:
                if LossDraws(model, 2, arc_keys([(i, j), (j, i)])).lost(t, 0).any():
                    Wt[i, i] += Wt[i, j]
                    Wt[i, j] = 0.0
        assert torch.equal(Wt, Wt.T)
        X = Wt @ X
        eng.step()
        assert torch.allclose(eng.block.x, X, rtol=0, atol=1e-13), t
    assert eng.network.delivery.lost_total.sum() > 0
    assert torch.allclose(eng.block.x.mean(0), mean0, rtol=0, atol=1e-14)
    directed = Engine(EdgeGossip(), topologies.build("directed-random:p=0.3", 8, weights="push", seed=3), x0,
                      network="loss=0.3")
    with pytest.raises(ConfigError, match="has no reverse: it needs an undirected graph"):
        directed.run(2)


def test_extra_under_loss_keeps_its_exact_optimum():
    """EXTRA (on_loss "edge") reaches the exact optimum under 10 % loss; renormalizing at the
    receiver alone (rows, not columns, summing to one) moves its fixed point."""
    from gossip.algorithms.tracking import EXTRA
    from tests.helpers.algorithm_setup import HETERO, distance

    class RenormalizedEXTRA(EXTRA):
        """EXTRA with the receiver-side renormalization of gossip."""

        name = "extra-renormalized"
        on_loss = "renormalize"

    x0 = HETERO.initial_point()
    eta = 0.3 / HETERO.smoothness().L
    runs = {}
    for alg in (EXTRA(eta=eta), RenormalizedEXTRA(eta=eta)):
        eng = Engine(alg, topologies.build("ring", 8), lambda i: x0, network="loss=0.1", seed=1,
                     oracles=lambda i, gen: HETERO.oracle(i, gen))
        for _ in range(1500):
            eng.step()
        runs[alg.name] = distance(eng, HETERO)
    assert runs["extra"] < 1e-12 and runs["extra-renormalized"] > 1e-6, runs


@pytest.mark.parametrize("name", ["dadam", "tracked-amsgrad", "accum-adamw"])
def test_adaptive_gossip_under_loss(name):
    """DADAM and AccumAdamW average models in (on_loss "renormalize", as D-PSGD): under loss (and late
    messages: the newest model from each neighbor) its rows still sum to one and it trains as
    without them. Tracked AMSGrad drops a lost edge at both ends
    (on_loss "edge"): W_t stays doubly stochastic, so its tracker keeps mean u = mean v̂
    exactly, which receiver-side renormalization breaks."""
    from gossip.algorithms import algorithm_class
    from tests.helpers.algorithm_setup import HETERO, distance

    ring = topologies.build("ring", 8)
    x0 = HETERO.initial_point()
    hp = algorithm_class(name).suggest_hparams(HETERO, "full", ring)

    def run(alg, network):
        eng = Engine(alg, ring, lambda i: x0, network=network, seed=1,
                     oracles=lambda i, gen: HETERO.oracle(i, gen))
        for _ in range(300):
            eng.step()
        return eng

    ideal, lossy = run(make_algorithm(name, **hp), None), run(make_algorithm(name, **hp), "loss=0.1")
    assert lossy.network.delivery.lost_total.sum() > 0
    assert distance(lossy, HETERO) < 3 * distance(ideal, HETERO)
    if name in ("dadam", "accum-adamw"):
        late = run(make_algorithm(name, **hp), "stale=geom:0.5;loss=0.1")
        assert late.network.stale.late_total.sum() > 0
        assert distance(late, HETERO) < 1.5 * distance(ideal, HETERO)
    if name == "tracked-amsgrad":
        from gossip.algorithms.adaptive_gossip import TrackedAMSGrad

        class Renormalized(TrackedAMSGrad):
            """Tracked AMSGrad with gossip's receiver-side renormalization."""

            name = "tracked-amsgrad-renormalized"
            on_loss = "renormalize"

        def gap(eng):
            u, v = eng.block.state["u"].mean(0), eng.block.state["v_max"].mean(0)
            return float((u - v).norm() / v.norm())

        assert gap(lossy) < 1e-13 and gap(run(Renormalized(**hp), "loss=0.1")) > 1e-4


def test_copies_of_adaptive_and_momentum_methods_are_refused_under_loss():
    """CHOCO-AMSGrad (not tracked-amsgrad's "edge": its copies miss a lost increment), DoCoM
    and DES-LOC stay refused (docs/network.md says why)."""
    from tests.helpers.algorithm_setup import HETERO

    ring = topologies.build("ring", 8)
    x0 = HETERO.initial_point()
    for name, compressor in (("choco-amsgrad", "topk:0.5"), ("docom", "topk:0.5"),
                             ("desloc", "none")):
        with pytest.raises(ConfigError, match=f"{name} has no defined meaning for a lost message"):
            Engine(make_algorithm(name), ring, lambda i: x0, compressor=compressor,
                   network="loss=0.1", oracles=lambda i, gen: HETERO.oracle(i, gen))
