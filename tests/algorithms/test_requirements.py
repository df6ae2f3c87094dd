"""Requirements: what an algorithm needs of a run, checked once by the engine; and the compressor
properties those checks (and the algorithms' defaults) read instead of spec strings."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

import topologies
from examples.my_parts import StochasticInt8
from gossip.algorithms import REGISTRY, Algorithm, make_algorithm
from gossip.algorithms.lead import default_lead_hparams
from gossip.compress import make
from gossip.core.requirements import Graph, Requirements
from gossip.engine import Engine
from gossip.errors import ConfigError
from gossip.layout import Layout
from gossip.problems import make_problem

N, D = 8, 6
RING = topologies.build("ring", N)
ONE_PEER = topologies.build("one-peer-exponential", N)
DIRECTED = topologies.build("directed-exponential", N)
PROBLEM = make_problem("least-squares", n_nodes=N, dim=D, samples_per_node=10, seed=3, dtype=torch.float64)


def x0(i):
    return torch.full((D,), float(i), dtype=torch.float64)


def oracles(i, gen):
    return PROBLEM.oracle(i, gen)


def engine(name, topology=RING, compressor="none", with_oracles=True, **kw):
    alg = make_algorithm(name) if isinstance(name, str) else name
    return Engine(alg, topology, x0, compressor=compressor, oracles=oracles if with_oracles else None, **kw)


# -- each refusal, through the engine, with a message that says what to do -------------------
@pytest.mark.parametrize(("name", "topology", "compressor", "with_oracles", "message"), [
    ("choco", ONE_PEER, "none", False,
     r"choco keeps per-neighbor state and needs a static topology, but 'one-peer-exponential.*' "
     r"changes every round; use a static graph, or an algorithm that keeps no per-neighbor"),
    ("lead", DIRECTED, "none", True,
     r"lead needs a symmetric mixing matrix, but 'directed-exponential.*' is directed; use a "
     r"symmetric graph \(e.g. 'exponential' instead of 'directed-exponential'\)"),
    ("onebit-adam", RING, "none", True,
     r"onebit-adam is an all-reduce method: every node talks to every other one, but node 0 of "
     r"'ring.*' has 2 of 7 neighbors; use --topology complete"),
    ("onebit-adam", ONE_PEER, "none", True,
     r"onebit-adam is an all-reduce method and needs the static complete graph: use --topology complete"),
    ("lead", RING, "none", False, r"lead needs gradients: give it a problem \(an oracle per node\)"),
    ("dadam", RING, "topk:0.5", True, r"dadam mixes exact models: use --compressor none \(got 'topk:0.5'\)"),
    ("extra", RING, "fp16", True, r"extra sends uncompressed vectors but the compressor is 'fp16'; use "
                                  r"--compressor none"),
    ("onebit-adam", topologies.build("complete", N), "sign", True,
     r"onebit-adam compresses inside its own all-reduce .*\(got 'sign'\): use --compressor none"),
    ("powergossip", RING, "lead:2", True, r"set its rank \(--rank R\) and leave the compressor at 'none'"),
    ("lead", RING, "lowrank:1", True,
     r"lead needs a compressor of bounded variance .*'lowrank:1' has none: use a quantizer or a sparsifier"),
    ("c-ecl", RING, "lowrank:1", True, r"c-ecl sends one stream per edge; 'lowrank:1' keeps state per "
                                       r"stream: use a stateless compressor"),
])
def test_each_refusal_is_raised_before_any_message_with_what_to_use(name, topology, compressor,
                                                                    with_oracles, message):
    with pytest.raises(ConfigError, match=message):
        engine(name, topology, compressor, with_oracles)


def test_lead_refuses_lowrank_per_tensor_too_and_takes_every_bounded_compressor():
    layout = Layout([(2, 3)])
    with pytest.raises(ConfigError, match="bounded variance"):
        engine("lead", compressor="lowrank:1", layout=layout)
    for spec in ("none", "fp16", "topk:0.5", "randk:0.5:unbiased", "sign", "qsgd:4", "lead:2", "natural"):
        engine("lead", compressor=spec)


def test_requirements_check_directly():
    static = Requirements()
    static.check(RING, make("topk:0.5"), False)  # the defaults: static symmetric, no gradients, any
    with pytest.raises(ConfigError, match="my-method keeps per-neighbor state"):
        static.check(ONE_PEER, make("none"), False, name="my-method")
    anywhere = Requirements(graph=Graph(static=False, symmetric=False))
    anywhere.check(ONE_PEER, make("none"), False)
    anywhere.check(DIRECTED, make("none"), False)
    # a time-varying symmetric graph is fine for a method that is only symmetric
    Requirements(graph=Graph(static=False)).check(ONE_PEER, make("none"), False)
    with pytest.raises(ConfigError, match="symmetric"):
        Requirements(graph=Graph(static=False)).check(DIRECTED, make("none"), False)
    # the default refusal of a lossy compressor for an identity-only method
    with pytest.raises(ConfigError, match=r"my-method sends exact vectors and takes only the identity "
                                          r"compressor \(got 'qsgd:4'\): use --compressor none"):
        Requirements(compressor="identity").check(RING, make("qsgd:4"), True, name="my-method")
    with pytest.raises(ConfigError, match="stateless"):
        Requirements(compressor="stateless").check(RING, make("lowrank:1"), True)
    with pytest.raises(ConfigError, match="'any', 'identity', 'bounded-variance', 'stateless'"):
        Requirements(compressor="lossless")


class _Averaging(Algorithm):
    """A user's algorithm: plain gossip averaging, no neighbor state."""

    name = "user-averaging"
    requires = Requirements(graph=Graph(static=False, symmetric=False))

    def step(self, block):
        q = block.encode(block.x)
        inbox = yield q
        mix = torch.zeros_like(block.x)
        block.mix_into(mix, q, inbox, own_weight=block.self_weight - 1.0)
        block.x.add_(mix)


class _ExactGradient(_Averaging):
    """Its subclass: needs gradients and exact messages, on the same graphs."""

    name = "user-exact"
    requires = replace(_Averaging.requires, gradients=True, compressor="identity")

    def step(self, block):
        block.x.sub_(block.gradients(torch.empty_like(block.x)), alpha=0.01)
        yield from super().step(block)


def test_a_user_algorithm_is_checked_by_its_requires():
    assert _ExactGradient.requires.graph == Graph(static=False, symmetric=False)
    engine(_Averaging(), ONE_PEER, "topk:0.5", with_oracles=False).run(2, log_every=2)
    engine(_ExactGradient(), ONE_PEER).run(2, log_every=2)
    with pytest.raises(ConfigError, match="user-exact needs gradients"):
        engine(_ExactGradient(), ONE_PEER, with_oracles=False)
    with pytest.raises(ConfigError, match=r"user-exact sends exact vectors .*\(got 'topk:0.5'\)"):
        engine(_ExactGradient(), RING, "topk:0.5")

    class Static(_Averaging):
        name = "user-static"
        requires = replace(_Averaging.requires, graph=Graph())

    with pytest.raises(ConfigError, match="user-static keeps per-neighbor state"):
        engine(Static(), ONE_PEER, with_oracles=False)


def test_the_former_need_flags_are_refused_with_what_to_declare():
    with pytest.raises(ConfigError, match=r"Old declares needs_oracle, static_topology: .*requires = Requirements"):
        class Old(_Averaging):
            static_topology = False
            needs_oracle = True


def test_every_registered_algorithm_declares_a_requirements_value_and_takes_none():
    complete, star = topologies.build("complete", N), topologies.build("star", N)
    for name, cls in REGISTRY.items():
        assert isinstance(cls.requires, Requirements), name
        topo = complete if cls.requires.graph.complete else star if cls.requires.graph.star else RING
        cls.requires.check(topo, make("none"), True, name=name)


# -- compressor properties ---------------------------------------------------------------------
# spec: is_identity, unbiased, bounded_variance, omega_exact, stateful, omega_for(100)
PROPERTIES = {
    "none": (True, True, True, True, False, 0.0),
    "fp16": (False, False, True, False, False, None),
    "bf16": (False, False, True, False, False, None),
    "topk:0.1": (False, False, True, False, False, None),
    "randk:0.1": (False, False, True, False, False, None),
    "randk:0.1:unbiased": (False, True, True, True, False, 9.0),
    "sign": (False, False, True, False, False, None),
    "sign_l2": (False, False, True, False, False, None),
    "qsgd:4": (False, True, True, False, False, 1.25),  # min(d/s², √d/s), s = 8
    "lead:2": (False, True, True, False, False, 5.0),  # min(d/4^b, √d/2^(b−1))
    "natural": (False, True, True, False, False, 0.125),
    "lowrank:2": (False, False, False, False, True, None),
}


@pytest.mark.parametrize("spec", sorted(PROPERTIES))
def test_compressor_properties_of_every_built_in_spec(spec):
    c = make(spec)
    got = (c.is_identity, c.unbiased, c.bounded_variance, c.omega_exact, c.stateful, c.omega_for(100))
    assert got == PROPERTIES[spec]


def test_per_tensor_compressors_keep_the_properties_of_their_codec():
    layout = Layout([(4, 5), (10,)])
    assert make("none", layout).is_identity and not make("fp16", layout).is_identity
    assert not make("lowrank:1", layout).bounded_variance and make("topk:0.5", layout).bounded_variance
    per_tensor = make("randk:0.5:unbiased", layout)
    assert per_tensor.unbiased and per_tensor.omega_for(30) == 1.0
    assert not per_tensor.omega_exact  # Σ_t ω_t ‖x_t‖² is only bounded by max ω ‖x‖²


def test_a_user_codec_gets_sensible_defaults():
    c = make("examples.my_parts:StochasticInt8")
    assert isinstance(c, StochasticInt8)
    assert (c.is_identity, c.unbiased, c.bounded_variance, c.omega_exact, c.stateful) == (
        False, True, True, False, False)
    assert c.omega_for(100) == pytest.approx(100 / (4 * 127**2))
    engine("lead", compressor=c)  # bounded variance: LEAD takes it
    with pytest.raises(ConfigError, match="mixes exact models"):
        engine("dadam", compressor=c)


def test_lead_defaults_follow_the_properties_not_the_class():
    randk = make("randk:0.1:unbiased")
    gamma_dual = min(1.0, 1.0 / ((3.0 * 9.0 + 1.0) * 2.0))
    assert default_lead_hparams(randk, 100, 2.0) == {"alpha": min(0.1, gamma_dual), "gamma_dual": gamma_dual}
    assert default_lead_hparams(make("lead:2"), 100, 2.0) == {"alpha": 0.5, "gamma_dual": 1.0}
    assert default_lead_hparams(make("none"), 100, 2.0) == {"alpha": 1.0, "gamma_dual": 1.0}
    assert default_lead_hparams(make("topk:0.1"), 100, 2.0) == {"alpha": 0.1, "gamma_dual": 0.5}
    randk.omega_exact = False  # the same ω as a worst-case bound only: the quantizers' rule
    assert default_lead_hparams(randk, 100, 2.0) == {"alpha": 0.5, "gamma_dual": 1.0}
