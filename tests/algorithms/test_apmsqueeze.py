"""APMSqueeze (docs/algorithms/apmsqueeze.md) is 1-bit Adam under its first name: the float64
reference of 1-bit Adam (Adam warm-up, then 1-bit momentum preconditioned by the frozen v),
the same bits and bytes as onebit-adam, and 1-bit Adam's defaults."""

from __future__ import annotations

import pytest
import torch

import topologies
from gossip.algorithms import make_algorithm
from tests.helpers.reference_adaptive import onebit_adam, quadratic_problem, run_engine


@pytest.mark.parametrize(("n", "codec"), [(4, "sign_l2"), (3, "none")])
def test_equals_the_reference(n, codec):
    """``codec = none``: after the warm-up, momentum SGD preconditioned by the frozen v on the
    exact average (the spec's C = identity reduction)."""
    d = 29
    data, grads = quadratic_problem(n, d, seed=n)
    x0 = torch.zeros(n, d, dtype=torch.float64)
    hp = dict(eta=0.05, freeze_step=4)
    _, X = run_engine(make_algorithm("apmsqueeze", codec=codec, **hp),
                      topologies.build("complete", n), x0, data, 12)
    torch.testing.assert_close(X, onebit_adam(x0, grads, 12, codec=codec, **hp), rtol=1e-11,
                               atol=1e-11)


def test_is_onebit_adam_bit_for_bit():
    n, d = 4, 23
    data, _ = quadratic_problem(n, d, seed=2)
    x0 = torch.randn(n, d, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    hp = dict(eta=0.03, freeze_step=3, eps=1e-4)
    ours, X = run_engine(make_algorithm("apmsqueeze", **hp), topologies.build("complete", n), x0,
                         data, 10)
    theirs, Y = run_engine(make_algorithm("onebit-adam", **hp), topologies.build("complete", n),
                           x0, data, 10)
    assert torch.equal(X, Y) and ours.transport.bytes_sent == theirs.transport.bytes_sent


def test_defaults_are_onebit_adams():
    assert make_algorithm("apmsqueeze").hparams() == make_algorithm("onebit-adam").hparams()
