"""gossip.rng: counter-based streams (placement independence, keys, statistics, devices) and
the randomized compressors on them (unbiasedness, block encode == per-row encode)."""

from __future__ import annotations

import hashlib
import math

import numpy as np
import pytest
import torch

from gossip.compress import make
from gossip.rng import Draw16, Stream, as_stream

NODES = [4, 17, 0, 9, 123456]


def _one(seed, node, t, call, stream=0):
    s = Stream(seed, [node], stream)
    s.begin_round(t)
    s.call = call
    return s


@pytest.mark.parametrize("draw", ["words", "bits16", "bits32", "uniform", "normal", "seeds"])
def test_rows_equal_one_node_streams(draw):
    s = Stream(7, NODES)
    s.begin_round(3)
    s.words(5)  # call 0; the draw below is call 1
    args = () if draw == "seeds" else (37,)
    block = getattr(s, draw)(*args)
    assert s.call == 2
    for r, node in enumerate(NODES):
        one = getattr(_one(7, node, 3, 1), draw)(*args)
        assert torch.equal(block[r : r + 1], one)
        row = Stream(7, NODES)
        row.begin_round(3)
        row.call = 1
        rs = row.row(r)
        assert row.call == 1 and rs.call == 1
        assert torch.equal(getattr(rs, draw)(*args), one)


def test_placement_independence():
    """The same node in different blocks, positions and orders draws the same numbers."""
    a = Stream(1, [3, 8, 5])
    b = Stream(1, [5, 99, 3, 42])
    for s in (a, b):
        s.begin_round(11)
    ua, ub = a.uniform(100, dtype=torch.float64), b.uniform(100, dtype=torch.float64)
    assert torch.equal(ua[0], ub[2]) and torch.equal(ua[2], ub[0])
    assert not torch.equal(ua[0], ua[1])
    # a prefix of a longer draw is the shorter draw (index-keyed words)
    assert torch.equal(_one(1, 3, 11, 0).words(1000)[:, :10], _one(1, 3, 11, 0).words(10))


def test_keys_differ():
    base = _one(5, 2, 4, 0).words(64)
    for other in (_one(6, 2, 4, 0), _one(5, 3, 4, 0), _one(5, 2, 5, 0), _one(5, 2, 4, 1),
                  _one(5, 2, 4, 0, stream="tracker"), _one(5, 2, 4, 0, stream=1)):
        w = other.words(64)
        assert (w != base).float().mean() > 0.99
    # begin_round resets the call counter; every draw advances it
    s = Stream(5, [2])
    s.begin_round(4)
    assert torch.equal(s.words(64), base)
    assert not torch.equal(s.words(64), base)
    s.begin_round(4)
    assert torch.equal(s.words(64), base)


def test_sync_and_row_copy():
    s = Stream(0, [1, 2])
    s.begin_round(2)
    r = s.row(1)
    r.bits16(8)
    r.bits16(8)
    assert s.call == 0
    s.sync(r)
    assert (s.round, s.call) == (2, 2)


def test_uniform_chi_square_and_exact_grid():
    s = _one(123, 0, 1, 0)
    n, bins = 200_000, 64
    for dtype, p in ((torch.float32, 24), (torch.float64, 53), (torch.float16, 11)):
        u = s.uniform(n, dtype=dtype)[0].double()
        assert float(u.min()) >= 0.0 and float(u.max()) < 1.0
        assert torch.equal(u * 2.0**p, torch.floor(u * 2.0**p))  # the exact grid j·2^-p
        counts = torch.histc(u, bins=bins, min=0.0, max=1.0)
        expect = n / bins
        chi2 = float(((counts - expect) ** 2 / expect).sum())
        assert chi2 < 63 + 6 * math.sqrt(2 * 63), (dtype, chi2)  # ~6 sigma
    # 16-bit lanes: every value equally likely
    b = s.bits16(1 << 20)[0].int() + 32768
    counts = torch.bincount(b >> 10, minlength=64).double()
    chi2 = float(((counts - counts.mean()) ** 2 / counts.mean()).sum())
    assert chi2 < 63 + 6 * math.sqrt(2 * 63)


def test_normal_moments():
    z = _one(9, 3, 2, 0).normal(400_000, dtype=torch.float64)[0]
    assert abs(float(z.mean())) < 0.01
    assert abs(float(z.var()) - 1.0) < 0.01
    assert abs(float((z**3).mean())) < 0.03
    assert abs(float((z**4).mean()) - 3.0) < 0.06
    z32 = _one(9, 3, 2, 0).normal(1001, dtype=torch.float32)
    assert z32.shape == (1, 1001) and z32.dtype == torch.float32
    assert torch.equal(z32, z[:1001].float().unsqueeze(0))


def test_seeds_non_negative_and_distinct():
    s = Stream(0, range(1000))
    seeds = s.seeds()
    assert int(seeds.min()) >= 0 and seeds.unique().numel() == 1000


def test_as_stream():
    assert as_stream(None) is None
    s = Stream(0, [0])
    assert as_stream(s) is s
    g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    a, b = as_stream(g1), as_stream(g2)
    assert torch.equal(a.words(8), b.words(8))
    assert not torch.equal(as_stream(g1).words(8), a.words(8))  # the generator advanced
    with pytest.raises(TypeError):
        as_stream(3)


def test_torch_and_numpy_hash_paths_agree():
    """The CPU (numpy) words equal the torch-ops words other devices use."""
    from gossip.rng import _fmix_

    s = Stream(77, NODES)
    s.begin_round(9)
    w = s.words(300)
    s.begin_round(9)
    k, g = s._keys()
    z = torch.arange(300).unsqueeze(0) * torch.from_numpy(g).unsqueeze(1) + torch.from_numpy(k).unsqueeze(1)
    _fmix_(z, torch.empty_like(z))
    assert torch.equal(z, w)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_equals_cpu():
    for nodes in ([5], NODES):
        for draw, kw in (("words", {}), ("bits16", {}), ("uniform", {"dtype": torch.float32}),
                         ("uniform", {"dtype": torch.float64}), ("seeds", {})):
            cpu, dev = Stream(3, nodes), Stream(3, nodes)
            for s in (cpu, dev):
                s.begin_round(6)
            args = () if draw == "seeds" else (1001,)
            a = getattr(cpu, draw)(*args, **kw)
            b = getattr(dev, draw)(*args, device="cuda", **kw)
            assert b.device.type == "cuda" and torch.equal(a, b.cpu()), draw
        cpu, dev = Stream(3, nodes), Stream(3, nodes)
        torch.testing.assert_close(cpu.normal(999, dtype=torch.float64),
                                   dev.normal(999, dtype=torch.float64, device="cuda").cpu(),
                                   rtol=1e-14, atol=1e-14)
    # compressors: the same dither on both devices
    for spec in ("randk:0.1", "natural"):
        c = make(spec)
        x = torch.randn(4, 999, dtype=torch.float32)
        a = c.encode_rows(x, Stream(1, [0, 1, 2, 3]))
        b = c.encode_rows(x.cuda(), Stream(1, [0, 1, 2, 3]))
        assert torch.equal(a, b.cpu()), spec


# ------------------------------------------------------------------------ compressors
RANDOMIZED = ["qsgd:4", "qsgd:2:biased", "qsgd:s=3", "lead:2", "lead:4", "natural", "randk:0.1",
              "randk:0.2:unbiased"]


@pytest.mark.parametrize("spec", RANDOMIZED)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_encode_rows_equals_per_row(spec, dtype):
    c = make(spec)
    g = torch.Generator().manual_seed(1)
    X = torch.randn(len(NODES), 203, generator=g, dtype=dtype)
    X[2].zero_()
    rng = Stream(5, NODES)
    rng.begin_round(2)
    rng.words(1)
    block = c.encode_rows(X, rng)
    assert block.data_ptr() % 8 == 0 and block.stride(0) % 8 == 0
    for r, node in enumerate(NODES):
        one = _one(5, node, 2, 1)
        p = c.encode(X[r], one)
        assert torch.equal(block[r], p.to_bytes()), (spec, r)
        assert one.call == rng.call
    # decode rows == per-row decode_add_
    w = torch.tensor([0.5, -1.0, 2.0, 0.25, 1.5], dtype=dtype)
    out = torch.randn(len(NODES), 203, generator=g, dtype=dtype)
    expect = out.clone()
    for r in range(len(NODES)):
        c.decode_add_(expect[r], c.from_bytes(block[r].clone(), X[r]), float(w[r]))
    c.decode_add_rows_(out, block, w)
    assert torch.equal(out, expect)


@pytest.mark.parametrize("spec", ["qsgd:2", "lead:2", "natural", "randk:0.25:unbiased"])
def test_unbiased_empirically(spec):
    c = make(spec)
    d, trials = 64, 1500
    x = torch.randn(d, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    rng = Stream(2, range(trials))
    rng.begin_round(1)
    block = c.encode_rows(x.expand(trials, d).contiguous(), rng)
    mean = torch.zeros(trials, d, dtype=torch.float64)
    c.decode_add_rows_(mean, block, 1.0)
    err = mean.mean(0) - x
    # per-entry standard error of the mean ≤ sqrt(Var/trials); Var ≤ ω‖x‖²-ish bound per entry
    sd = mean.std(0) / math.sqrt(trials)
    assert float((err.abs() / sd.clamp_min(1e-12)).max()) < 5.0, spec


def test_dither_resolution_bias_is_tiny():
    """16-bit dither: P(round up) is the fraction (to 2^-17, far below this test's noise)."""
    c = make("lead:1")  # s = 1: codes are ⌊y + u⌋ with y = x_0/‖x‖_∞
    n = 1 << 18
    for f in (0.1, 0.77):
        x = torch.full((n + 1,), f, dtype=torch.float64)
        x[-1] = 1.0  # ‖x‖_∞ = 1: every other entry rounds to 0 or 1 with P(1) = f
        dec = c.decode(c.encode(x, _one(0, 1, 1, 0)))[:-1]
        p = float(dec.mean())
        assert abs(p - f) < 6 * math.sqrt(f * (1 - f) / n), (f, p)


def test_draw16_lanes_equal_bits16():
    """Lazy draws (any ranges, in or out of order, several draws interleaved) give the lanes of
    ``bits16`` of the same call, and advance the call counter the same way."""
    s, t = Stream(5, [3, 8]), Stream(5, [3, 8])
    s.begin_round(2)
    t.begin_round(2)
    n = 1001
    ref, ref2 = s.bits16(n), s.bits16(n)
    draws, draws2 = t.draw16(n), t.draw16(n)
    assert (s.round, s.call) == (t.round, t.call)
    for r in range(2):
        got = np.concatenate([draws[r].lanes(a, min(a + 96, n)).copy() for a in range(0, n, 96)])
        assert np.array_equal(got, ref[r].numpy())
        assert np.array_equal(draws2[r].lanes(0, n), ref2[r].numpy())
        for a, b in ((500, 777), (0, 5), (3, 4), (992, 1001)):  # out of order, unaligned
            assert np.array_equal(draws[r].lanes(a, b), ref[r, a:b].numpy())
            assert np.array_equal(draws2[r].lanes(a, b), ref2[r, a:b].numpy())
        assert torch.equal(draws[r].tensor(), ref[r : r + 1])
        assert torch.equal(Draw16(n, given=ref[r]).tensor(), ref[r : r + 1])


@pytest.mark.parametrize("n", [1, 3, 4, 5, 64, 1001, 4099])
def test_draw16_chunks_equal_bits16(n):
    """Streaming a draw (any chunk size, the last chunk short) gives the lanes of ``bits16``,
    also for a draw that wraps lanes already drawn."""
    ref = Stream(5, [3, 8]).bits16(n)
    draws = Stream(5, [3, 8]).draw16(n)
    for r in range(2):
        for step in (4, 64, 96, 1 << 12):
            for dr in (draws[r], Draw16(n, given=ref[r])):
                got = [(a, b, lanes.copy()) for a, b, lanes in dr.chunks(step)]
                assert [(a, b) for a, b, _ in got] == [(a, min(a + step, n)) for a in range(0, n, step)]
                assert np.array_equal(np.concatenate([lanes for *_, lanes in got]), ref[r].numpy())


KNOWN_WORDS = [0xC79C2FB60D04F856, 0x008961E246C48E93, 0x1A84E1B82A9A6AF7,  # Stream(7, [0, 5]).words(3)
               0x961686436C58B090, 0x1538EA93E08BF5D5, 0x56670609C1E2D79D]  # at round 3
KNOWN_BYTES = {  # sha256[:16] of the message: (dtype, d, spec)
    ("float32", 1000, "qsgd:4"): "24c8447d7e615084",
    ("float32", 1000, "lead:2"): "498bbd68d6fb76ea",
    ("float32", 1000, "natural"): "8866cd9174595f5e",
    ("float32", 1000, "qsgd:12"): "4ba969263c755403",
    ("float32", 300001, "qsgd:4"): "9f9cf89e0b370c8e",
    ("float32", 300001, "lead:2"): "1f417ae43b2db10c",
    ("float32", 300001, "natural"): "fc7f0cf882f9dcb1",
    ("float32", 300001, "qsgd:12"): "a3f3aca5783108c9",
    ("float64", 1000, "qsgd:4"): "cdf99aa1306b5f34",
    ("float64", 1000, "lead:2"): "17526745805dadff",
    ("float64", 1000, "natural"): "7cac3b96a90ece30",
    ("float64", 1000, "qsgd:12"): "d447ae13f07ea261",
    ("float64", 300001, "qsgd:4"): "1ab30676cc4f5ef8",
    ("float64", 300001, "lead:2"): "87109d5e377b5cd1",
    ("float64", 300001, "natural"): "b5045275ec069089",
    ("float64", 300001, "qsgd:12"): "c5eaf54b32268e11",
}


def test_known_answers():
    """The hash words and the quantizers' messages are pinned (the wire depends on both, and
    optimizations must not change a byte): x has small half-integer entries, so ‖x‖₂ is exact
    in any summation order; d = 300 001 spans several encoder chunks, the last one short."""
    s = Stream(7, [0, 5])
    s.begin_round(3)
    assert [int(v) & ((1 << 64) - 1) for v in s.words(3).view(-1)] == KNOWN_WORDS
    for (dtype, d, spec), digest in KNOWN_BYTES.items():
        i = torch.arange(d, dtype=torch.int64)
        x = (((i * 2654435761) % 7 - 3) * 0.5).to(getattr(torch, dtype))
        x[::7] = 0.0
        st = Stream(11, [2])
        st.begin_round(5)
        msg = make(spec).encode(x, st).to_bytes().numpy().tobytes()
        assert hashlib.sha256(msg).hexdigest()[:16] == digest, (dtype, d, spec)


def test_block_streams_independent_of_placement():
    """A node's main, named and edge streams draw the same numbers whether it sits alone in a
    block or beside others; both ends of an edge draw the same numbers."""
    from types import SimpleNamespace

    from gossip.core.block import Block
    from gossip.core.routing import ArcPlan

    def block(ids):
        b = Block([SimpleNamespace(id=i) for i in ids], torch.zeros(len(ids), 3), make("none"),
                  lambda: make("none"), seed=11)
        b.begin_round(4, None)
        return b

    pair, alone = block([3, 5]), block([5])
    words = pair.rng.words(4)
    assert torch.equal(words[1], alone.rng.words(4)[0])
    assert torch.equal(words[0], _one(11, 3, 4, 0).words(4)[0])
    assert torch.equal(pair.stream_rng("tracker").words(4)[0],
                       _one(11, 3, 4, 0, "tracker").words(4)[0])
    a, b = block([3]), block([5])
    ra = a.arc_rng(ArcPlan.build([(3, 5)], [3], torch.device("cpu")), "edge", undirected=True)
    rb = b.arc_rng(ArcPlan.build([(5, 3)], [5], torch.device("cpu")), "edge", undirected=True)
    assert torch.equal(ra.normal(6), rb.normal(6))


def test_derived_seeds_are_fixed_functions_of_the_run_seed():
    """Every seed derived from the run seed keeps its value (a changed purpose or derivation
    would change every run's numbers); the values are those of seed 7, node 3."""
    from gossip import rng

    assert [rng.node_seed(7, 3), rng.init_seed(7, 3), rng.data_seed(7, 3), rng.oracle_seed(7, 3)] == [
        7964965305340474863, 1729168002221264068, 19284261266525483, 2206337441919982745]
    assert [rng.model_seed(7), rng.split_seed(7), rng.partition_seed(7)] == [
        2228000872240873687, 7498092397237277296, 1085775682357979809]
    assert len({rng.node_seed(7, n) for n in range(64)} | {rng.data_seed(7, n) for n in range(64)}) == 128
