"""Tests of gossip.problems: gradients, optima, estimators, data, partitions, errors."""

from __future__ import annotations

import gzip

import numpy as np
import pytest
import torch

from gossip.errors import ConfigError
from gossip.problems import (
    PROBLEMS,
    Consensus,
    L1Logistic,
    Lasso,
    LeastSquares,
    Logistic,
    default_hparams,
    load_libsvm,
    make_problem,
    partition,
    synthetic,
)

F64 = torch.float64


def small(name: str, **kw):
    kw = {"n_nodes": 3, "dim": 7, "samples_per_node": 6, "seed": 0, "dtype": F64, **kw}
    return make_problem(name, **kw)


def ragged(name: str):
    """A problem with unequal sample counts per node (5, 9, 2)."""
    rng = np.random.default_rng(11)
    A = [rng.standard_normal((m, 4)) for m in (5, 9, 2)]
    if name in ("least-squares", "lasso"):
        b = [rng.standard_normal(a.shape[0]) for a in A]
    else:
        b = [np.where(rng.standard_normal(a.shape[0]) > 0, 1.0, -1.0) for a in A]
    cls = {"least-squares": LeastSquares, "logistic": Logistic, "lasso": Lasso,
           "l1-logistic": L1Logistic}[name]
    if name in ("lasso", "l1-logistic"):
        return cls(A, b, l1=0.05, l2=0.1, dtype=F64)
    return cls(A, b, 0.1, dtype=F64)


def autograd_loss(pb, i, x):
    """``f_i`` written independently of the library, differentiable."""
    A, b = pb.A[i], pb.b[i]
    z = A @ x
    if isinstance(pb, LeastSquares):
        data = ((z - b) ** 2).sum() / (2 * A.shape[0])
    else:
        data = torch.log1p(torch.exp(-b * z)).mean()
    return data + 0.5 * pb.l2 * (x * x).sum()


# ---- values and gradients ---------------------------------------------------------------------


@pytest.mark.parametrize("name", PROBLEMS)
def test_gradients_match_autograd(name):
    for pb in (small(name), ragged(name)):
        gen = torch.Generator().manual_seed(1)
        for i in range(pb.n_nodes):
            x = torch.randn(pb.dim, dtype=F64, generator=gen).requires_grad_(True)
            f = autograd_loss(pb, i, x)
            (g,) = torch.autograd.grad(f, x)
            x = x.detach()
            assert pb.local_loss(i, x) == pytest.approx(f.item(), rel=1e-13)
            assert torch.allclose(pb.grad_full(i, x), g, rtol=1e-12, atol=1e-14)
            out = torch.empty_like(x)
            assert pb.grad_full(i, x, out) is out


@pytest.mark.parametrize("name", PROBLEMS)
def test_gradient_matches_finite_differences(name):
    pb = small(name)
    x = torch.linspace(-1, 1, pb.dim, dtype=F64)
    h = 1e-6
    for i in range(pb.n_nodes):
        g = pb.grad_full(i, x)
        fd = torch.tensor([
            (pb.local_loss(i, x + h * e) - pb.local_loss(i, x - h * e)) / (2 * h)
            for e in torch.eye(pb.dim, dtype=F64)
        ], dtype=F64)
        assert torch.allclose(g, fd, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("name", PROBLEMS)
def test_sample_gradients_average_to_full_gradient(name):
    pb = ragged(name)
    x = torch.linspace(-0.5, 0.7, pb.dim, dtype=F64)
    for i in range(pb.n_nodes):
        m = pb.n_samples(i)
        idx = torch.arange(m)
        full = pb.grad_full(i, x)
        assert pb.sample_grads(i, idx, x).shape == (m, pb.dim)
        assert torch.allclose(pb.sample_grads(i, idx, x).mean(0), full, atol=1e-14)
        assert torch.allclose(pb.batch_grad(i, idx, x), full, atol=1e-14)
        assert torch.allclose(pb.coefficients(i, x)[idx[:1]], pb.coefficients(i, x, idx[:1]))


def test_objective_applies_regularizer_once():
    pb = small("lasso")
    x = torch.linspace(-1, 1, pb.dim, dtype=F64)
    mean = sum(pb.local_loss(i, x) for i in range(pb.n_nodes)) / pb.n_nodes
    assert pb.objective(x) == pytest.approx(mean + pb.l1 * float(x.abs().sum()), rel=1e-14)
    assert pb.objective64(x.numpy()) == pytest.approx(pb.objective(x), rel=1e-13)


def test_logistic_is_stable_for_huge_margins():
    pb = small("logistic")
    x = torch.full((pb.dim,), 1e4, dtype=F64)
    for i in range(pb.n_nodes):
        assert np.isfinite(pb.local_loss(i, x))
        assert torch.isfinite(pb.grad_full(i, x)).all()
        assert np.isfinite(pb.local_loss(i, -x))


def test_float32_problem():
    p32 = small("logistic", dtype=torch.float32)
    p64 = small("logistic")
    x = torch.linspace(-1, 1, p32.dim)
    g = p32.grad_full(1, x)
    assert g.dtype == torch.float32
    assert torch.allclose(g.double(), p64.grad_full(1, x.double()), atol=1e-6)
    assert p32.solution().dtype == torch.float32
    assert p32.solution(dtype=F64).dtype == F64


# ---- constants and optima ---------------------------------------------------------------------


def test_smoothness_constants():
    pb = ragged("least-squares")
    s = pb.smoothness()
    eig = [torch.linalg.eigvalsh(A.T @ A / A.shape[0]) for A in pb.A]
    assert s.L == pytest.approx(max(float(e[-1]) for e in eig) + pb.l2, rel=1e-12)
    assert s.mu == pytest.approx(pb.l2, rel=1e-9)  # node 2 has 2 < 4 samples: λ_min = 0
    assert s.L_max == pytest.approx(max(float((A * A).sum(1).max()) for A in pb.A) + pb.l2)
    lg = ragged("logistic").smoothness()
    assert lg.L == pytest.approx(0.25 * (s.L - pb.l2) + 0.1, rel=1e-12)
    assert lg.mu == 0.1
    assert s.L_max >= s.L


@pytest.mark.parametrize("name", ["least-squares", "logistic"])
def test_solution_is_stationary(name):
    pb = make_problem(name, n_nodes=4, dim=30, samples_per_node=25, dtype=F64)
    xs = pb.solution(dtype=F64)
    g = sum(pb.grad_full(i, xs) for i in range(pb.n_nodes)) / pb.n_nodes
    assert float(g.norm()) < 1e-10
    assert pb.optimal_value() <= pb.objective(xs + 1e-4) and pb.solution() is not xs


@pytest.mark.parametrize("name", ["lasso", "l1-logistic"])
def test_l1_solution_satisfies_subgradient_condition(name):
    pb = make_problem(name, n_nodes=4, dim=30, samples_per_node=25, dtype=F64)
    xs = pb.solution()
    g = sum(pb.grad_full(i, xs) for i in range(pb.n_nodes)) / pb.n_nodes
    nz = xs != 0
    assert 0 < int(nz.sum()) < pb.dim  # a genuinely sparse solution
    assert float((g[nz] + pb.l1 * xs[nz].sign()).abs().max()) < 1e-10
    assert float(g[~nz].abs().max()) <= pb.l1 + 1e-10


def test_solution_is_cached_and_read_only():
    pb = small("lasso")
    a = pb.solution_numpy()
    assert pb.solution_numpy() is a and not a.flags.writeable
    pb.solution().add_(1.0)  # a copy: the cache is untouched
    assert np.array_equal(pb.solution_numpy(), a)


def test_consensus_problem():
    c = np.arange(12.0).reshape(3, 4)
    pb = Consensus(c, dtype=F64)
    assert np.allclose(pb.solution_numpy(), c.mean(0))
    x = torch.zeros(4, dtype=F64)
    assert torch.equal(pb.grad_full(2, x), -torch.tensor(c[2]))
    assert not pb.finite_sum
    with pytest.raises(ValueError, match="not one"):
        pb.oracle(0, torch.Generator(), "sgd")
    assert torch.equal(pb.oracle(0).grad(x), -torch.tensor(c[0]))


def test_default_hparams():
    pb = small("lasso")
    s = pb.smoothness()
    assert default_hparams(pb)["eta"] == pytest.approx(1 / s.L)
    for est in ("sgd", "lsvrg", "saga"):
        assert default_hparams(pb, est)["eta"] == pytest.approx(1 / (6 * s.L_max))
    with pytest.raises(ValueError, match="unknown gradient estimator"):
        default_hparams(pb, "adam")


# ---- oracles -----------------------------------------------------------------------------------


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _clone(state):
    return {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in state.items()}


@pytest.mark.parametrize("name", ["least-squares", "l1-logistic"])
@pytest.mark.parametrize("est", ["sgd", "lsvrg", "saga"])
def test_estimators_are_unbiased(name, est):
    """E_l[g] over all samples equals ∇f_i(x) exactly (up to rounding) in any estimator state."""
    pb = small(name, samples_per_node=9)
    o = pb.oracle(1, _gen(3), est)
    gen = _gen(4)
    for _ in range(7):  # move the state away from its initialisation
        o.grad(torch.randn(pb.dim, dtype=F64, generator=gen))
    x = torch.randn(pb.dim, dtype=F64, generator=gen)
    saved = _clone(o.state_dict())
    mean = torch.zeros(pb.dim, dtype=F64)
    for l in range(pb.n_samples(1)):
        o.load_state_dict(saved)
        mean += o.grad_at(x, torch.tensor([l]))
    mean /= pb.n_samples(1)
    assert torch.allclose(mean, pb.grad_full(1, x), rtol=0, atol=1e-13)


@pytest.mark.parametrize("est", ["lsvrg", "saga"])
def test_variance_reduced_first_estimate_is_full_gradient(est):
    pb = small("logistic")
    x = torch.linspace(-1, 1, pb.dim, dtype=F64)
    g = pb.oracle(0, _gen(0), est).grad(x)
    assert torch.allclose(g, pb.grad_full(0, x), rtol=0, atol=1e-15)


def test_saga_generic_table_matches_glm_scalars():
    """The m × d table path (non-GLM problems) gives the same estimates as the scalar one.

    Equal only without L2: with it the GLM path evaluates ``l2·x`` exactly instead of storing
    ``l2·w_l`` per sample (both unbiased; documented in gossip.problems.oracles).
    """
    from gossip.problems.oracles import SAGA

    pb = small("least-squares", samples_per_node=5, l2=0.0)
    a = SAGA(pb, 0, _gen(5), 2)
    b = SAGA(_NotGLM(pb), 0, _gen(5), 2)
    gen = _gen(6)
    for _ in range(6):
        x = torch.randn(pb.dim, dtype=F64, generator=gen)
        assert torch.allclose(a.grad(x), b.grad(x), atol=1e-13)
    assert b.table.shape == (5, pb.dim) and a.table.shape == (5,)


class _NotGLM:
    """Delegates to a GLM but is not one (exercises the generic finite-sum code paths)."""

    linear_model = False

    def __init__(self, pb):
        self._pb = pb

    def __getattr__(self, name):
        return getattr(self._pb, name)


def test_lsvrg_generic_path_and_refresh():
    from gossip.problems.oracles import LSVRG

    pb = small("logistic", samples_per_node=5)
    a = LSVRG(pb, 2, _gen(7), 3, p=1.0)
    b = LSVRG(_NotGLM(pb), 2, _gen(7), 3, p=1.0)
    gen = _gen(8)
    for _ in range(5):
        x = torch.randn(pb.dim, dtype=F64, generator=gen)
        assert torch.allclose(a.grad(x), b.grad(x), atol=1e-14)
        assert torch.equal(a.w, x)  # p = 1: the reference point follows x
    c = pb.oracle(0, _gen(9), "lsvrg")
    assert c.p == pytest.approx(1 / 5)


@pytest.mark.parametrize("est", ["sgd", "lsvrg", "saga"])
def test_same_seed_same_samples(est):
    pb = small("lasso", samples_per_node=20)
    xs = [torch.randn(pb.dim, dtype=F64, generator=_gen(k)) for k in range(15)]

    def run(seed, batch=1):
        o = pb.oracle(0, _gen(seed), est, batch_size=batch)
        return torch.stack([o.grad(x).clone() for x in xs])

    assert torch.equal(run(1), run(1))
    assert not torch.equal(run(1), run(2))
    assert torch.equal(run(1, 4), run(1, 4))


def test_minibatch_draws_distinct_samples():
    pb = small("least-squares", samples_per_node=10)
    o = pb.oracle(0, _gen(0), "sgd", batch_size=10)
    x = torch.linspace(-1, 1, pb.dim, dtype=F64)
    assert torch.allclose(o.grad(x), pb.grad_full(0, x), atol=1e-14)  # all 10, each once
    idx = pb.oracle(0, _gen(0), "sgd", batch_size=4).sample()
    assert idx.unique().numel() == 4


def test_state_dict_roundtrip():
    pb = small("l1-logistic", samples_per_node=12)
    gen = _gen(5)
    xs = [torch.randn(pb.dim, dtype=F64, generator=gen) for _ in range(20)]
    for est in ("sgd", "lsvrg", "saga", "full"):
        a = pb.oracle(0, _gen(1), est)
        assert a.state_dict()["sample_grads"] == 0
        for x in xs[:10]:
            a.grad(x)
        state, gstate = _clone(a.state_dict()), a.generator.get_state()
        assert all(isinstance(v, torch.Tensor | int) for v in state.values())
        rest_a = [a.grad(x).clone() for x in xs[10:]]
        b = pb.oracle(0, _gen(99), est)
        b.load_state_dict(state)
        b.generator.set_state(gstate)
        rest_b = [b.grad(x).clone() for x in xs[10:]]
        assert all(torch.equal(u, v) for u, v in zip(rest_a, rest_b, strict=True))
        assert b.sample_grads == a.sample_grads


def test_prox():
    x = torch.tensor([3.0, -0.05, 0.0, -2.0, 0.1], dtype=F64)
    lasso = small("lasso", l1=0.5)
    o = lasso.oracle(0)
    assert o.has_prox
    expected = torch.tensor([2.8, 0.0, 0.0, -1.8, 0.0], dtype=F64)
    assert torch.allclose(o.prox(x, 0.4), expected)
    y = x.clone()
    assert o.prox(y, 0.4, out=y) is y and torch.allclose(y, expected)
    o2 = small("logistic").oracle(0)
    assert not o2.has_prox
    with pytest.raises(ConfigError, match="no regularizer"):
        o2.prox(x, 0.1)


def test_oracle_errors():
    pb = small("least-squares")
    g = _gen(0)
    with pytest.raises(ValueError, match="unknown gradient estimator 'svrg'"):
        pb.oracle(0, g, "svrg")
    with pytest.raises(ValueError, match=r"batch_size must be an int in \[1, m_i\] = \[1, 6\]"):
        pb.oracle(0, g, "sgd", batch_size=7)
    with pytest.raises(ValueError, match="batch_size"):
        pb.oracle(0, g, "saga", batch_size=0)
    with pytest.raises(ValueError, match="needs the node's torch.Generator"):
        pb.oracle(0, None, "sgd")
    with pytest.raises(ValueError, match="LSVRG refresh probability"):
        pb.oracle(0, g, "sgd", p=0.5)
    with pytest.raises(ValueError, match=r"in \(0, 1\]"):
        pb.oracle(0, g, "lsvrg", p=0.0)
    with pytest.raises(ConfigError, match=r"node index must be an int in \[0, 3\)"):
        pb.oracle(3, g)
    x = torch.zeros(pb.dim, dtype=F64)
    with pytest.raises(ConfigError, match="must not alias"):
        pb.oracle(0).grad(x, out=x)


def test_problem_construction_errors():
    A, b = [np.ones((3, 2))], [np.array([1.0, -1.0, 2.0])]
    with pytest.raises(ConfigError, match=r"labels must be \+1 or -1; node 0 has label 2"):
        Logistic(A, b, 0.1)
    with pytest.raises(ConfigError, match="needs l2 > 0"):
        Logistic(A, [np.ones(3)], 0.0)
    with pytest.raises(ConfigError, match="needs l1 > 0"):
        Lasso(A, b, 0.0)
    with pytest.raises(ConfigError, match="A_0 has 3 rows but b_0 has 2"):
        LeastSquares(A, [np.ones(2)])
    with pytest.raises(ConfigError, match="A_1 has 3 columns"):
        LeastSquares(A + [np.ones((2, 3))], b + [np.ones(2)])
    with pytest.raises(ConfigError, match="NaN"):
        LeastSquares([np.full((1, 1), np.nan)], [np.ones(1)])
    with pytest.raises(ValueError, match="unknown problem 'ridge'"):
        make_problem("ridge")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_problem_and_oracles():
    pb = small("l1-logistic", device="cuda", samples_per_node=10)
    assert pb.A[0].is_cuda
    x = torch.zeros(pb.dim, dtype=F64, device="cuda")
    ref = small("l1-logistic", samples_per_node=10)
    assert torch.allclose(pb.grad_full(0, x).cpu(), ref.grad_full(0, x.cpu()))
    for est in ("sgd", "lsvrg", "saga"):
        gen = torch.Generator(device="cuda").manual_seed(0)
        g = pb.oracle(0, gen, est, batch_size=3).grad(x)
        assert g.is_cuda and torch.isfinite(g).all()
    assert pb.oracle(0).prox(x + 1, 0.1).is_cuda
    assert torch.allclose(pb.solution().cpu(), ref.solution())


# ---- synthetic data ----------------------------------------------------------------------------


def test_synthetic_recipes():
    d = synthetic("least-squares", 4, 10, 15, seed=3)
    assert len(d.A) == 4 and d.A[0].shape == (15, 10) and d.b[0].shape == (15,)
    assert d.x_true.shape == (4, 10)
    again = synthetic("least-squares", 4, 10, 15, seed=3)
    assert all(np.array_equal(a, b) for a, b in zip(d.A, again.A, strict=True))
    homo = synthetic("least-squares", 4, 10, 15, heterogeneity=0.0, seed=3)
    assert np.allclose(homo.x_true, homo.x_true[0])
    assert np.abs(d.b[0] - d.A[0] @ d.x_true[0]).max() < 0.6  # 0.1·N(0,1) noise
    lg = synthetic("logistic", 4, 10, 50, seed=3)
    assert set(np.unique(np.concatenate(lg.b))) == {-1.0, 1.0}
    sp = synthetic("lasso", 4, 50, 5, seed=3, common=0.0)
    assert all(np.count_nonzero(x) == 10 for x in sp.x_true)  # 20 % non-zeros
    sp2 = synthetic("l1-logistic", 4, 50, 5, seed=3)
    assert all(np.count_nonzero(x) <= 20 for x in sp2.x_true)
    with pytest.raises(ValueError, match="unknown synthetic kind"):
        synthetic("ridge", 2, 3, 4)
    with pytest.raises(ValueError, match="dim must be an int >= 1"):
        synthetic("lasso", 2, 0, 4)


# ---- partitions --------------------------------------------------------------------------------


def _check_cover(parts, N, n):
    assert len(parts) == n
    allidx = np.concatenate(parts)
    assert np.array_equal(np.sort(allidx), np.arange(N))
    assert all(p.size >= 1 for p in parts)


def test_partition_iid():
    parts = partition(103, 10, "iid", seed=1)
    _check_cover(parts, 103, 10)
    sizes = [p.size for p in parts]
    assert max(sizes) - min(sizes) <= 1
    assert all(np.array_equal(a, b) for a, b in zip(parts, partition(103, 10, seed=1), strict=True))
    assert not all(np.array_equal(a, b) for a, b in zip(parts, partition(103, 10, seed=2),
                                                        strict=True))


def test_partition_sorted():
    y = np.random.default_rng(0).integers(0, 5, size=60)
    parts = partition(y, 6, "sorted")
    _check_cover(parts, 60, 6)
    for a, b in zip(parts[:-1], parts[1:], strict=True):
        assert y[a].max() <= y[b].min()


def test_partition_dirichlet():
    y = np.repeat(np.arange(4), 50)
    parts = partition(y, 8, "dirichlet:0.1", seed=3)
    _check_cover(parts, 200, 8)
    assert all(np.array_equal(a, b)
               for a, b in zip(parts, partition(y, 8, "dirichlet:0.1", seed=3), strict=True))
    # small alpha: most nodes are dominated by one class; large alpha: close to uniform
    purity = np.mean([np.bincount(y[p], minlength=4).max() / p.size for p in parts])
    flat = partition(y, 8, "dirichlet:1000", seed=3)
    purity_flat = np.mean([np.bincount(y[p], minlength=4).max() / p.size for p in flat])
    assert purity > 0.7 and purity_flat < 0.45
    tiny = partition(np.zeros(9), 9, "dirichlet:0.01", seed=0)  # forces the empty-node fix
    _check_cover(tiny, 9, 9)


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ((10, 3, "random"), "unknown partition 'random'"),
        ((np.zeros(10), 3, "dirichlet:abc"), "write dirichlet:ALPHA"),
        ((np.zeros(10), 3, "dirichlet:-1"), "ALPHA must be > 0"),
        ((np.zeros(2), 3, "iid"), "only 2 samples"),
        ((np.array([0.5, 1.0, 2.0]), 2, "dirichlet:1"), "labels must be integers, got 0.5"),
        ((10, 3, "sorted"), "needs the labels"),
        ((10, 0, "iid"), "n_nodes must be an int >= 1"),
    ],
)
def test_partition_errors(args, match):
    with pytest.raises(ValueError, match=match):
        partition(*args)


# ---- LibSVM ------------------------------------------------------------------------------------

GOOD = """# a comment line
0 1:0.5 3:-2   # trailing comment

1 qid:4 2:1e-1 1:3
0
"""


def test_load_libsvm(tmp_path):
    p = tmp_path / "tiny.svm"
    p.write_text(GOOD)
    X, y = load_libsvm(p)
    assert X.dtype == np.float64 and X.shape == (3, 3)
    assert np.array_equal(X, [[0.5, 0, -2], [3, 0.1, 0], [0, 0, 0]])
    assert np.array_equal(y, [-1, 1, -1])
    X5, y_raw = load_libsvm(p, n_features=5, binary=False)
    assert X5.shape == (3, 5) and np.array_equal(y_raw, [0, 1, 0])
    gz = tmp_path / "tiny.svm.gz"
    with gzip.open(gz, "wt") as fh:
        fh.write(GOOD)
    assert np.array_equal(load_libsvm(gz)[0], X)
    multi = tmp_path / "multi.svm"
    multi.write_text("1 1:1\n2 1:2\n3 2:1\n")
    assert np.array_equal(load_libsvm(multi)[1], [1, 2, 3])
    with pytest.raises(ConfigError, match="exactly two distinct labels, found 3"):
        load_libsvm(multi, binary=True)


@pytest.mark.parametrize(
    ("line", "match"),
    [
        ("abc 1:2", "label 'abc' is not a number"),
        ("1 1:2 3", "token '3' is not of the form index:value"),
        ("1 x:2", "feature index 'x' in 'x:2' is not an integer"),
        ("1 0:2", "feature index 0 in '0:2': indices are 1-based"),
        ("1 2:1 2:3", "feature index 2 appears twice"),
        ("1 2:zz", "value 'zz' in '2:zz' is not a number"),
        ("1 2:nan", "value 'nan' in '2:nan' is not a finite number"),
        ("1 9:1", "feature index 9 exceeds n_features=4"),
    ],
)
def test_load_libsvm_errors_name_the_line(tmp_path, line, match):
    p = tmp_path / "bad.svm"
    p.write_text("1 1:1\n# fine\n" + line + "\n")
    with pytest.raises(ConfigError, match=f"bad.svm:3: {match}"):
        load_libsvm(p, n_features=4)


def test_load_libsvm_refuses_a_huge_index_before_allocating(tmp_path):
    """Feature index 10^12: a 14.6 TiB dense matrix, refused with the line, not attempted."""
    p = tmp_path / "huge.svm"
    p.write_text("1 1:0.5\n# fine\n-1 2:1 1000000000000:1\n")
    with pytest.raises(ConfigError, match=r"huge.svm: 2 samples x 1000000000000 features "
                                                r"\(the largest index, 1000000000000, on line 3\)"):
        load_libsvm(p)


def test_load_libsvm_empty(tmp_path):
    p = tmp_path / "empty.svm"
    p.write_text("# nothing\n\n")
    with pytest.raises(ConfigError, match="no samples"):
        load_libsvm(p)


def test_make_problem_from_libsvm(tmp_path):
    rng = np.random.default_rng(0)
    lines = []
    for k in range(40):
        feats = " ".join(f"{j + 1}:{rng.standard_normal():.6f}" for j in range(5))
        lines.append(f"{k % 2} {feats}")
    p = tmp_path / "data.svm"
    p.write_text("\n".join(lines) + "\n")
    pb = make_problem("l1-logistic", n_nodes=4, data=p, partition_scheme="sorted", dtype=F64)
    assert pb.n_nodes == 4 and pb.dim == 5
    assert sum(pb.n_samples(i) for i in range(4)) == 40
    assert torch.equal(pb.b[0], -torch.ones(10, dtype=F64))  # sorted: first node all -1
    assert pb.l2 == pytest.approx(1 / 40)
    ls = make_problem("least-squares", n_nodes=3, data=p, partition_scheme="dirichlet:0.5")
    assert ls.dtype == torch.float32 and sum(ls.n_samples(i) for i in range(3)) == 40


def test_large_dimension_code_paths_agree(monkeypatch):
    """The iterative eigenvalue and Newton-CG paths (used for large sizes) match the dense ones."""
    import gossip.problems.glm as glm
    import gossip.problems.solvers as solvers

    kw = {"n_nodes": 3, "dim": 20, "samples_per_node": 30, "dtype": F64}
    dense = make_problem("logistic", **kw)
    s, xs = dense.smoothness(), dense.solution_numpy()
    monkeypatch.setattr(glm, "DENSE_EIG_MAX", 5)
    monkeypatch.setattr(solvers, "NEWTON_MAX_DIM", 5)
    big = make_problem("logistic", **kw)
    assert big.smoothness().L == pytest.approx(s.L, rel=1e-10)
    assert big.smoothness().mu == s.mu
    assert np.abs(big.solution_numpy() - xs).max() < 1e-12
