"""The chunked all-reduce and the all-reduce optimizers equal their dense references."""

from __future__ import annotations

import pytest
import torch

import topologies
from gossip.algorithms import make_algorithm
from gossip.errors import ConfigError
from tests.helpers.reference_adaptive import onebit_adam, quadratic_problem, run_engine


def _close(a, b, tol=1e-11):
    torch.testing.assert_close(a, b, rtol=tol, atol=tol)


@pytest.mark.parametrize(("n", "codec"), [(4, "sign_l2"), (3, "sign_l1"), (5, "none")])
def test_onebit_adam_equals_reference(n, codec):
    d = 37
    data, grads = quadratic_problem(n, d, seed=n)
    x0 = torch.zeros(n, d, dtype=torch.float64)
    hp = dict(eta=0.05, freeze_step=4)
    eng, X = run_engine(make_algorithm("onebit-adam", codec=codec, **hp),
                        topologies.build("complete", n), x0, data, 12)
    ref = onebit_adam(x0, grads, 12, codec=codec, **hp)
    _close(X, ref)
    assert float((X - X[0]).abs().max()) == 0.0  # identical models on every node
    # bytes: warm-up rounds full precision (2(n-1)·D'/n values), then 1 bit + one scale a chunk
    fp_pad = -(-d // n) * n
    unit = n * (n * 8 // __import__("math").gcd(n, 8))
    pad = -(-d // unit) * unit
    per_fp = 2 * (n - 1) * (fp_pad // n) * 8
    per_c = 2 * (n - 1) * (pad // n // 8 + 8) if codec != "none" else per_fp
    assert eng.transport.bytes_sent[0] == 4 * per_fp + 8 * per_c


def test_the_codec_is_a_registered_compressor():
    """``sign`` is ``sign_l1`` (bit for bit, same bytes); ``fp16`` travels in chunks too,
    with error feedback; the all-reduce holds the registry's compressors."""
    from gossip.algorithms.allreduce import ChunkedAllReduce
    from gossip.compress import ScaledSign, ScaledSignL2, Vote

    n, d = 4, 37
    data, _ = quadratic_problem(n, d, seed=3)
    x0 = torch.zeros(n, d, dtype=torch.float64)
    runs = {}
    for codec in ("sign_l1", "sign", "fp16"):
        eng, X = run_engine(make_algorithm("onebit-adam", codec=codec, eta=0.05, freeze_step=2),
                            topologies.build("complete", n), x0, data, 6)
        runs[codec] = (X, eng.transport.bytes_sent[0])
        ar = eng.block.workspace["ar"]
        assert ar.error_feedback and "ar_worker_error" in eng.block.state
    assert torch.equal(runs["sign"][0], runs["sign_l1"][0]) and runs["sign"][1] == runs["sign_l1"][1]
    assert float((runs["fp16"][0] - runs["sign_l1"][0]).abs().max()) > 0
    assert isinstance(ChunkedAllReduce(n, d, "sign_l1").worker, ScaledSign)
    assert isinstance(ChunkedAllReduce(n, d, "sign_l2").worker, ScaledSignL2)
    even, odd = ChunkedAllReduce(4, d, "vote"), ChunkedAllReduce(5, d, "vote")
    assert isinstance(even.server, Vote) and even.server.ties and not odd.server.ties
    assert not even.error_feedback and not ChunkedAllReduce(n, d, "none").error_feedback


@pytest.mark.parametrize(("codec", "n", "per_message"), [
    # (bytes of the phase-1 message, of the phase-2 message) for chunks of c entries (float64)
    ("none", 4, lambda c: (8 * c, 8 * c)),
    ("sign_l2", 4, lambda c: (c // 8 + 8, c // 8 + 8)),
    ("sign_l1", 3, lambda c: (c // 8 + 8, c // 8 + 8)),
    ("vote", 4, lambda c: (c // 8, 2 * c // 8)),  # an even vote may tie: a zero plane back
    ("vote", 5, lambda c: (c // 8, c // 8)),
    ("fp16", 3, lambda c: (2 * c, 2 * c)),
])
def test_allreduce_messages_are_the_chunks_bodies(codec, n, per_message):
    from gossip.algorithms.allreduce import ChunkedAllReduce

    ar = ChunkedAllReduce(n, 37, codec)
    one, two = per_message(ar.chunk)
    assert (ar._phase_nbytes(torch.float64, 1), ar._phase_nbytes(torch.float64, 2)) == (one, two)
    assert ar.nbytes(torch.float64) == (n - 1) * (one + two)


@pytest.mark.parametrize(("make_it", "message"), [
    (lambda: make_algorithm("onebit-adam", codec="vote"), "codec = 'vote': choose sign_l2.*not bounded"),
    (lambda: make_algorithm("zero-one-adam", codec="topk:0.1"), "codec = 'topk:0.1'.*cannot travel in chunks"),
    (lambda: make_algorithm("onebit-lamb", codec="bogus"), "codec = 'bogus'.*unknown compressor 'bogus'"),
    (lambda: __import__("gossip.algorithms.allreduce", fromlist=["x"]).ChunkedAllReduce(4, 10, "qsgd:4"),
     "all-reduce codec 'qsgd:4' cannot travel in chunks"),
    (lambda: __import__("gossip.algorithms.allreduce", fromlist=["x"]).ChunkedAllReduce(4, 10, "sign_l3"),
     "all-reduce codec 'sign_l3'.*unknown compressor"),
])
def test_bad_codecs_are_refused_with_the_reason(make_it, message):
    with pytest.raises(ConfigError, match=message):
        make_it()


def test_allreduce_needs_complete_graph_and_no_gossip_compressor():
    data, _ = quadratic_problem(4, 5)
    x0 = torch.zeros(4, 5, dtype=torch.float64)
    with pytest.raises(ConfigError, match="onebit-adam is an all-reduce method.*--topology complete"):
        run_engine(make_algorithm("onebit-adam"), topologies.build("ring", 4), x0, data, 1)
    with pytest.raises(ConfigError, match="--compressor none"):
        run_engine(make_algorithm("onebit-adam"), topologies.build("complete", 4), x0, data, 1,
                   compressor="sign")


@pytest.mark.parametrize(("codec", "wd"), [("sign_l2", 0.0), ("sign_l1", 0.05)])
def test_onebit_lamb_equals_reference(codec, wd):
    from gossip.engine import Engine
    from gossip.layout import Layout
    from tests.helpers.reference_adaptive import QuadraticOracle, onebit_lamb

    n, shapes, sizes, rounds = 4, [(2, 5), (3, 3), (4,)], [10, 9, 4], 14
    d = sum(sizes)
    data, grads = quadratic_problem(n, d, seed=11)
    x0 = torch.full((n, d), 0.3, dtype=torch.float64)
    hp = dict(eta=0.02, freeze_step=6, weight_decay=wd, codec=codec, max_coeff=3.0)
    eng = Engine(make_algorithm("onebit-lamb", **hp), topologies.build("complete", n),
                 lambda i: x0[i], layout=Layout(shapes), seed=1,
                 oracles=lambda i, gen: QuadraticOracle(data, i))
    eng.run(rounds, log_every=rounds)
    X = torch.stack([eng.nodes[i].x for i in range(n)])
    _close(X, onebit_lamb(x0, grads, rounds, sizes=sizes, **hp))
    assert float((X - X[0]).abs().max()) == 0.0
    st = eng.nodes[0].state
    assert float(st["trust"].min()) > 0 and not torch.equal(st["last_factor"], torch.ones(3))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_sign_l2_compressor_keeps_the_norm_and_matches_the_torch_path(dtype, monkeypatch):
    from gossip.compress import dispatch, make

    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2000, generator=gen, dtype=dtype)
    c = make("sign_l2")
    host = c.encode(x).to_bytes().clone()
    y = c.decode(c.from_bytes(host, x))
    torch.testing.assert_close(y.norm(), x.norm(), rtol=1e-5, atol=0)
    assert torch.equal(torch.sign(y), torch.where(x < 0, -1.0, 1.0).to(dtype))
    assert host.numel() == make("sign").encode(x).to_bytes().numel()
    monkeypatch.setattr(dispatch, "NUMPY", False)
    assert torch.equal(c.encode(x).to_bytes(), host)
    # not contractive: on a 10-sparse vector in R^2000 the relative error is
    # √(2 − 2‖x‖₁/(√d‖x‖)) ≥ √(2 − 2√(10/2000)) ≈ 1.36 (ℓ1 scale: below 1)
    sparse = torch.zeros(2000, dtype=dtype)
    sparse[:10] = torch.randn(10, generator=gen, dtype=dtype)
    err = lambda spec: float((make(spec).decode(make(spec).encode(sparse)) - sparse).norm()  # noqa: E731
                             / sparse.norm())
    assert err("sign_l2") > 1.36 and err("sign") < 1.0
    assert torch.equal(make("sign_l1").decode(make("sign_l1").encode(x)), make("sign").decode(make("sign").encode(x)))
    assert c.delta_for(2000) is None


@pytest.mark.parametrize(("name", "hp", "message"), [
    ("onebit-adam", {"codec": "topk"}, "codec = 'topk': choose sign_l2"),
    ("onebit-adam", {"freeze_step": 0}, "freeze_step = 0: at least 1 warm-up round"),
    ("zero-one-adam", {"var_freeze_step": 0}, "var_freeze_step = 0"),
    ("onebit-lamb", {"min_coeff": 2.0, "max_coeff": 1.0}, "min_coeff <= max_coeff"),
    ("signum", {"beta": 1.0}, "beta = 1.0 must be in"),
    ("adasum", {"local": "lamb"}, "'adam' or 'sgd'"),
])
def test_bad_hyper_parameters_are_refused_up_front(name, hp, message):
    with pytest.raises(ConfigError, match=message):
        make_algorithm(name, **hp)


@pytest.mark.parametrize("codec", ["sign_l2", "none"])
def test_allreduce_errors_are_each_nodes_rows_of_the_block_state(codec):
    n, d = 5, 37
    data, _ = quadratic_problem(n, d)
    x0 = torch.zeros(n, d, dtype=torch.float64)
    eng, _ = run_engine(make_algorithm("onebit-adam", codec=codec, freeze_step=2),
                        topologies.build("complete", n), x0, data, 4)
    eng.node_state_dicts()  # mirrors the block's state into the nodes
    ar = eng.block.workspace["ar"]
    for r, (_, nd) in enumerate(sorted(eng.nodes.items())):
        if codec == "none":
            assert not any(k.endswith("_error") for k in nd.state)
            continue
        err = nd.state["ar_worker_error"]
        assert err.shape == (ar.padded,) and nd.state["ar_server_error"].shape == (ar.chunk,)
        assert err.data_ptr() == eng.block.state["ar_worker_error"][r].data_ptr()
        assert float(err.abs().sum()) > 0  # compressed rounds ran


def test_adasum_sends_to_its_partner_only():
    """One phase per level over the partner arcs: a message per node, d values each (bytes as
    the per-node round with its empty messages to the others)."""
    from gossip.engine import Engine
    from tests.helpers.reference_adaptive import QuadraticOracle

    n, d = 8, 13
    data, _ = quadratic_problem(n, d)
    eng = Engine(make_algorithm("adasum", eta=0.05), topologies.build("complete", n),
                 lambda i: torch.zeros(d, dtype=torch.float64),
                 oracles=lambda i, gen: QuadraticOracle(data, i))
    phases = []
    inner = eng.transport.start_rows

    def spy(rows, plan, seq, round_):
        phases.append((list(plan.senders), list(plan.arcs), rows.nbytes))
        return inner(rows, plan, seq, round_)

    eng.transport.start_rows = spy
    eng.run(2)
    assert len(phases) == 2 * 3
    for k, (senders, arcs, nbytes) in enumerate(phases):
        level = 1 << (k % 3)
        assert senders == list(range(n)) and arcs == [(i, i ^ level) for i in range(n)]
        assert nbytes == d * 8
    assert all(eng.transport.bytes_sent[i] == 2 * 3 * d * 8 for i in range(n))


@pytest.mark.parametrize(("name", "hp"), [
    ("onebit-adam", {"eta": 0.05, "freeze_step": 3}),
    ("apmsqueeze", {"eta": 0.05, "freeze_step": 3}),
    ("zero-one-adam", {"eta": 0.03, "var_freeze_step": 4, "var_update_scaler": 1,
                       "local_step_scaler": 2, "local_step_clipper": 4}),
    ("onebit-lamb", {"eta": 0.02, "freeze_step": 3, "weight_decay": 0.01}),
    ("signum", {"eta": 0.01}),
    ("adasum", {"eta": 0.05}),
])
def test_checkpoint_resume_equals_the_uninterrupted_run(tmp_path, name, hp):
    """The block state's rows (errors, counters, per-tensor ratios) go to the node files and
    come back in place: the resumed run is the uninterrupted one, bit for bit."""
    from gossip.checkpoint import Checkpointer
    from gossip.engine import Engine
    from gossip.layout import Layout
    from tests.helpers.reference_adaptive import QuadraticOracle

    n, d = 4, 23
    data, _ = quadratic_problem(n, d, seed=5)

    def engine():
        return Engine(make_algorithm(name, **hp), topologies.build("complete", n),
                      lambda i: torch.full((d,), 0.1 * (i + 1), dtype=torch.float64),
                      layout=Layout([(4, 5), (3,)]), seed=2,
                      oracles=lambda i, gen: QuadraticOracle(data, i))

    full = engine()
    full.run(10, log_every=10)
    cut = engine()
    cut.run(5, log_every=5)
    Checkpointer(tmp_path / "run00", {"test": name}).save(cut)
    resumed = engine()
    assert Checkpointer(tmp_path / "run00", {"test": name}).restore(resumed) == 5
    resumed.run(5, log_every=5)
    for i in range(n):
        assert torch.equal(resumed.nodes[i].x, full.nodes[i].x)
    a, b = resumed.node_state_dicts(), full.node_state_dicts()
    for i in range(n):
        assert a[i]["state"].keys() == b[i]["state"].keys()
        assert all(torch.equal(a[i]["state"][k], b[i]["state"][k]) for k in a[i]["state"])
        assert a[i]["bytes_sent"] == b[i]["bytes_sent"]
