"""Monte-Carlo checks of the compressors' laws: unbiasedness (mean within 4 standard errors,
coordinate-wise), variance ω and contraction δ against their bounds, the typical constants of
docs/compressors.md, and uniform rand-k index sets. Fixed seeds: the outcomes are deterministic."""

from __future__ import annotations

import math

import pytest
import torch

from gossip.compress import make
from gossip.compress.sparse import sample_distinct
from gossip.layout import Layout

Z = 4.0  # standard errors allowed


def draws(spec: str, x: torch.Tensor, n: int, seed: int = 2024, layout=None) -> torch.Tensor:
    """n decoded compressions of x (n × d), one generator stream."""
    g = torch.Generator().manual_seed(seed)
    c = make(spec, layout=layout)
    out = torch.empty(n, x.numel(), dtype=x.dtype)
    for i in range(n):
        c.decode(c.encode(x, g), out=out[i].view(x.shape))
    return out


def probe_vector() -> torch.Tensor:
    g = torch.Generator().manual_seed(77)
    x = torch.randn(24, generator=g, dtype=torch.float64)
    x[3] = 0.0
    x[7] = -x[5]  # a tie in magnitude
    x[11] = 3.0 * x.abs().max()  # one dominant entry
    return x


def mean_within(samples: torch.Tensor, target: torch.Tensor) -> None:
    n = samples.shape[0]
    mean = samples.mean(0)
    se = samples.std(0) / math.sqrt(n)
    dev = (mean - target).abs()
    assert bool((dev <= Z * se + 1e-12).all()), (dev / se.clamp_min(1e-30)).max()


def mse_stats(samples: torch.Tensor, x: torch.Tensor) -> tuple[float, float]:
    err = ((samples - x.view(1, -1)) ** 2).sum(1)
    return float(err.mean()), float(err.std() / math.sqrt(err.numel()))


@pytest.mark.parametrize(
    "spec", ["qsgd:4", "qsgd:s=3", "qsgd:1", "lead:2", "lead:1", "natural", "randk:0.25:unbiased"]
)
def test_unbiased_and_variance_bound(spec):
    x = probe_vector()
    y = draws(spec, x, 3000)
    mean_within(y, x)
    c = make(spec)
    assert c.unbiased
    mse, se = mse_stats(y, x)
    assert mse - Z * se <= c.omega_for(x.numel()) * float(x.norm() ** 2)


def test_unbiased_per_tensor():
    layout = Layout([(4, 3), (12,)])
    x = probe_vector()
    mean_within(draws("qsgd:2", x, 3000, layout=layout), x)


def test_natural_omega_is_tight():
    # worst case of natural compression: |x_i| = (4/3)·2^a gives variance exactly x_i²/8
    x = (4.0 / 3.0) * torch.exp2(torch.arange(-8.0, 8.0, dtype=torch.float64))
    x[::2] *= -1
    y = draws("natural", x, 3000)
    mse, se = mse_stats(y, x)
    assert abs(mse - float(x.norm() ** 2) / 8) <= Z * se


def test_randk_plain_is_contractive_in_expectation():
    x = probe_vector()
    y = draws("randk:0.25", x, 3000)
    k, d = 6, 24
    mean_within(y, x * (k / d))
    mse, se = mse_stats(y, x)
    assert abs(mse - (1 - k / d) * float(x.norm() ** 2)) <= Z * se


@pytest.mark.parametrize("spec", ["qsgd:2:biased", "qsgd:4:biased"])
def test_biased_qsgd_contraction(spec):
    x = probe_vector()
    y = draws(spec, x, 2000)
    c = make(spec)
    mse, se = mse_stats(y, x)
    assert mse - Z * se <= (1 - c.delta_for(x.numel())) * float(x.norm() ** 2)
    mean_within(y, x / (1 + c.omega_for(x.numel())))


@pytest.mark.parametrize(
    "spec,typical", [("qsgd:s=16", 1.25), ("lead:2", 0.64), ("lead:3", 0.16), ("natural", 0.082)]
)
def test_typical_constants_of_the_table(spec, typical):
    """docs/compressors.md: ‖C(x) − x‖²/‖x‖² on a Gaussian vector, d = 2000, 300 draws."""
    x = torch.randn(2000, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    y = draws(spec, x, 300)
    ratio = mse_stats(y, x)[0] / float(x.norm() ** 2)
    assert ratio == pytest.approx(typical, rel=0.2)
    assert ratio <= make(spec).omega_for(2000)


def test_sign_and_topk_typical_contraction():
    x = torch.randn(2000, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    for spec, one_minus_delta in (("sign", 1 - 2 / math.pi), ("topk:20", 0.91)):
        c = make(spec)
        y = c.decode(c.encode(x))
        assert float((y - x).norm() ** 2 / x.norm() ** 2) == pytest.approx(
            one_minus_delta, abs=0.02
        )


def test_randk_index_marginals_uniform():
    for n, k in ((4096, 100), (4096, 3000), (300, 40)):
        counts = torch.zeros(n)
        m = 400
        for seed in range(m):
            counts[sample_distinct(n, k, seed)] += 1
        expected = m * k / n
        chi2 = float(((counts - expected) ** 2 / expected).sum())
        # Σ over n cells of a multinomial-like count: chi2 ≈ (n − 1)·(1 − k/n) ± 5 sd
        mean = (n - 1) * (1 - k / n)
        assert abs(chi2 - mean) <= 5 * math.sqrt(2 * mean), (n, k, chi2, mean)


def test_randk_subsets_uniform():
    from itertools import combinations

    for n, k in ((6, 3), (3000, 2)):
        if n == 6:
            cells = {c: 0 for c in combinations(range(n), k)}
            m = 4000
            for seed in range(m):
                cells[tuple(sample_distinct(n, k, seed).tolist())] += 1
            expected = m / len(cells)
            chi2 = sum((v - expected) ** 2 / expected for v in cells.values())
            assert chi2 < 45  # 19 degrees of freedom: p ≈ 7e-4
        else:  # pairs of a large n: distance between the two indices ~ triangular law
            gaps = torch.tensor([float(torch.diff(sample_distinct(n, k, s))) for s in range(2000)])
            assert abs(float(gaps.mean()) - (n + 1) / 3) < 4 * float(gaps.std()) / math.sqrt(2000)
