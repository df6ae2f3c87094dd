"""The robust per-arc form is an option of the method: ``make_algorithm(name, arcs=True)`` and
the registered ``<name>-arcs`` build the same thing, the method's own code with its channels
routed per arc (acknowledged copies), and an author's method gets the form by declaring it."""

from __future__ import annotations

import pickle

import pytest
import torch

import topologies
from gossip.algorithms import (
    ALGORITHMS,
    REGISTRY,
    Algorithm,
    Requirements,
    algorithm_class,
    make_algorithm,
    register_algorithm,
)
from gossip.core.algorithm import ArcsForm
from gossip.core.channel import ArcRoute, Channel
from gossip.engine import Engine
from gossip.errors import ConfigError

METHODS = ["choco", "lead", "prox-lead", "beer", "c-gt"]


@pytest.fixture
def restore_algorithms():
    """Whatever a test registers ends with it."""
    saved = dict(ALGORITHMS.objects)
    yield
    ALGORITHMS.objects.clear()
    ALGORITHMS.objects.update(saved)


@pytest.mark.parametrize("name", METHODS)
def test_the_alias_is_the_method_with_the_option_on(name):
    method, form = REGISTRY[name], REGISTRY[f"{name}-arcs"]
    assert form is method.with_arcs() and issubclass(form, method)
    assert type(make_algorithm(name, arcs=True)) is form
    assert form.arcs and not method.arcs and form.on_loss == "ack"
    assert form.name == f"{name}-arcs" and make_algorithm(name, arcs=True).name == form.name
    # no round, setup or channel of its own: the method's code runs in both forms
    assert not {"step", "setup", "channel", "channels", "_channels"} & set(vars(form))


@pytest.mark.parametrize("name", ["motef", "cpp", "diging", "gossip"])
def test_a_method_without_a_declared_form_refuses_the_option(name):
    """MoTEF, CPP and DIGing inherit from BEER and C-GT but do not declare the form."""
    with pytest.raises(ConfigError, match=name):
        make_algorithm(name, arcs=True)
    assert f"{name}-arcs" not in REGISTRY


def test_the_option_on_a_built_instance_is_refused():
    with pytest.raises(ConfigError, match="arcs"):
        make_algorithm(make_algorithm("choco"), arcs=True)


def test_a_per_arc_instance_pickles_as_its_form():
    alg = make_algorithm("lead", arcs=True, eta=0.05)
    back = pickle.loads(pickle.dumps(alg))
    assert type(back) is algorithm_class("lead-arcs") and back.eta == 0.05


class Averaging(Algorithm):
    """An author's averaging method: ``x_i += γ (s_i − x̂_i)``, CHOCO's round uncompressed.

    Args:
        gamma: consensus step.
    """

    name = "test-averaging"
    arcs_form = ArcsForm(state_copies=3, neighbor_copies=2,
                         requires=Requirements(compressor="stateless"))

    def __init__(self, gamma: float = 0.4):
        self.gamma = gamma

    def setup(self, block):
        block.workspace["ch"] = Channel(block, "x", memory="choco", route=self.route())

    def step(self, block):
        ch = block.workspace["ch"]
        block.x.add_(ch.gap(), alpha=self.gamma)
        q = yield ch.send(block.x)
        ch.update(q)


def x0(i: int) -> torch.Tensor:
    return torch.arange(6, dtype=torch.float64) * (i + 1) - 3.0 * i


def test_an_authors_method_gets_its_per_arc_form_by_declaring_it(restore_algorithms):
    register_algorithm(Averaging)
    assert REGISTRY["test-averaging-arcs"] is Averaging.with_arcs()
    ring = topologies.build("ring", 12)
    with pytest.raises(ConfigError, match="test-averaging"):  # no meaning for a lost message
        Engine(make_algorithm("test-averaging"), ring, x0, compressor="topk:0.5",
               network="loss=0.3", dtype=torch.float64)
    eng = Engine(make_algorithm("test-averaging-arcs"), ring, x0, compressor="topk:0.5",
                 network="loss=0.3", dtype=torch.float64)
    mean0 = eng.mean_model().clone()
    eng.run(40)
    assert eng.record()["messages_lost_total"] > 50
    assert sorted(eng.block.arc_state) == ["x.in", "x.out"]  # ArcRoute's default keys
    assert float((eng.mean_model() - mean0).norm()) <= 1e-13 * float(mean0.norm())


def test_registering_a_form_whose_name_is_taken_registers_neither(restore_algorithms):
    class Taken(Averaging):
        name = "choco"  # its form's name, choco-arcs, is taken too
        arcs_form = Averaging.arcs_form

    class Other(Averaging):
        name = "test-other"
        arcs_form = Averaging.arcs_form

    register_algorithm(type("Clash", (Algorithm,), {"name": "test-other-arcs",
                                                    "step": Averaging.step}))
    with pytest.raises(ConfigError, match="test-other-arcs"):
        register_algorithm(Other)
    assert "test-other" not in REGISTRY
    with pytest.raises(ConfigError, match="choco"):
        register_algorithm(Taken)


def test_a_per_arc_route_refuses_other_weights_and_unknown_draws():
    eng = Engine(make_algorithm("gossip"), topologies.build("ring", 6), x0, dtype=torch.float64)
    with pytest.raises(ConfigError, match="weights"):
        Channel(eng.block, "z", memory="ef21", route="arcs", weights=lambda nd: lambda j: 0.5)
    Channel(eng.block, "z", memory="ef21", route="arcs", weights=lambda nd: None)  # w_ij: fine
    with pytest.raises(ConfigError, match="draws"):
        ArcRoute(draws="node")


def test_the_form_class_is_what_make_algorithm_builds():
    """Scripts size a run's memory from form_class(name, hparams): with ``arcs`` set it is the
    per-arc form (its per-arc copies), as make_algorithm builds it."""
    from gossip.algorithms import REGISTRY, form_class

    assert form_class("choco", {"arcs": True}) is REGISTRY["choco-arcs"]
    assert type(make_algorithm("choco", arcs=True)) is form_class("choco", {"arcs": True})
    assert form_class("choco", {"gamma": 0.5}) is REGISTRY["choco"] is form_class("choco")
    assert form_class("lead", {"arcs": True}).neighbor_copies > REGISTRY["lead"].neighbor_copies
