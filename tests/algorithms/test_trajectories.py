"""Every built-in algorithm's trajectory (tests/helpers/trajectories.py), guarded twice.

**On every machine: checkpoints within a tolerance.** After a few rounds of each scenario the
bytes sent must equal the recorded ones, and three float64 values of the models (``Σ|x|`` and
two fixed projections, computed from the models' bits alone) must lie within
``RTOL · Σ|x|`` of the recorded ones.

* What passes, and why that is right: rounding that differs from machine to machine. A drift
  of one unit in the last place (ulp) of every entry every round, random one-ulp noise, the
  mixing's sums added in the reverse order, torch's scalar kernels and MKL's compatible code
  path in place of this CPU's vector ones: each changes the bits of the runs and none moves a
  checkpoint past the tolerance (tests below). They are what another CPU does (a fused
  multiply-add rounds once where a multiply and an add round twice; vector and BLAS kernels
  split sums differently), and a check that runs everywhere cannot tell them from a code change
  that only rounds differently: it must accept both or fail on users' machines.
* What fails: a real change of the method. A step size changed in its sixth digit, one message
  lost, one node's model negated once, the trajectory shifted by one round: each moves some
  checkpoint by orders of magnitude more than the tolerance (tests below), which sits orders of
  magnitude above the rounding effects and below these.
* Why the runs are short: a compressor's decision (the entries top-k keeps, the level a
  quantizer rounds to) flips on a last-bit difference only at a near-tie, and after a flip two
  runs part by a quantization step, far beyond the tolerance; rounding errors also grow with
  the rounds. A few rounds keep both unlikely, and the noise tests below run every scenario
  with perturbed rounding, so a scenario that comes near such a tie (a new compressor, longer
  runs) fails here, on this machine, before it fails on a user's.

**On a recorded platform: every bit.** One SHA-256 per scenario over every round's models and
byte counts, compared only where every field of ``trajectories.platform()`` (CPU vendor, model
and SIMD flags, numba's LLVM target, torch's build and CPU capability, numpy's BLAS, library
versions, the C library, kernel-steering environment variables) equals a recorded platform's,
and skipped elsewhere with the fields that differ. It catches what the portable check must let
through (the drift, the reordered sums): the guard of a refactoring that must not change a
number. On any machine the same guard runs locally, before and after a change::

    python tests/helpers/trajectories.py --save /tmp/before.json
    python tests/helpers/trajectories.py --compare /tmp/before.json   # or make trajectories

After a change meant to alter numbers, ``python tests/helpers/trajectories.py --write``
records both again.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Callable

import numpy as np
import pytest
import torch

from gossip.core.block import Block
from gossip.engine import Engine
from gossip.errors import ConfigError
from gossip.network import LossDraws
from tests.helpers import mpi_adaptive, mpi_scenarios, mpi_tracking_scenarios, trajectories
from tests.helpers.launch import run_py

SCENARIO_MODULES = (mpi_scenarios, mpi_tracking_scenarios, mpi_adaptive, trajectories)
"""The modules whose ``Engine`` / ``make_algorithm`` build the scenarios."""


@pytest.fixture(scope="module")
def traces() -> dict[str, trajectories.Trace]:
    """Every scenario run once, as the code stands (both checks read it)."""
    return trajectories.compute()


@pytest.fixture(scope="module")
def data() -> dict:
    return trajectories.load()


def test_checkpoints_match_the_recorded_values(traces, data):
    recorded = data["checkpoints"]
    assert set(traces) == set(recorded), "scenarios added or removed: record them with --write"
    changed = {name: problems for name, tr in traces.items()
               if (problems := trajectories.compare_checkpoints(recorded[name], tr.checkpoints()))}
    assert not changed, f"trajectories changed (re-record with --write if meant): {changed}"


def test_exact_bits_match_this_platform(traces, data):
    fields = trajectories.platform()
    golden = trajectories.recorded_bits(data, fields)
    if golden is None:
        pytest.skip(trajectories.skip_reason(data, fields))
    assert set(traces) == set(golden)
    changed = sorted(name for name, tr in traces.items() if golden[name] != tr.digest)
    assert not changed, f"trajectories changed in their last bits: {changed}"


# -- the portable check: what it lets through ------------------------------------------------------
def _nudge(x: torch.Tensor, up: torch.Tensor) -> None:
    """Move every nonzero entry of ``x`` one ulp, up where ``up`` is True, else down (zeros,
    which any rounding of an exact zero keeps, stay)."""
    target = torch.where(up, math.inf, -math.inf).to(x.dtype)
    x.copy_(torch.where(x != 0, torch.nextafter(x, target), x))


def _drift(engine: Engine, t: int) -> None:
    """Every model entry one ulp up, every round."""
    for node in engine.nodes.values():
        _nudge(node.x, torch.ones_like(node.x, dtype=torch.bool))


def _noise() -> Callable[[Engine, int], None]:
    """Every model entry one ulp up or down at random, every round."""
    gen = torch.Generator().manual_seed(7)

    def noise(engine: Engine, t: int) -> None:
        for node in engine.nodes.values():
            _nudge(node.x, torch.rand(node.x.shape, generator=gen) < 0.5)
    return noise


def _reversed_decode_add(monkeypatch) -> None:
    """Mixing adds the terms of every sum in the reverse order (Block._decode_add's rows
    reversed: the same terms into the same targets, the other way round)."""
    original = Block._decode_add

    def reverse(self, comp, out, msgs, weight, dst, src, arcs=None):
        m = msgs.shape[0]
        if m > 1:
            back = torch.arange(m - 1, -1, -1)
            msgs = msgs[back]
            if isinstance(weight, torch.Tensor) and weight.numel() == m:
                weight = weight.reshape(-1)[back]
            dst = (dst if dst is not None else torch.arange(m))[back]
            src = src[back] if src is not None else None
            arcs = [arcs[k] for k in back.tolist()] if arcs is not None else None
        return original(self, comp, out, msgs, weight, dst, src, arcs)
    monkeypatch.setattr(Block, "_decode_add", reverse)


@pytest.mark.slow
@pytest.mark.parametrize("rounding", ["one-ulp drift per round", "one-ulp noise per round",
                                      "reversed sums in mixing"])
def test_rounding_differences_pass_the_portable_check_not_the_exact_one(traces, monkeypatch,
                                                                        rounding):
    after_round = None
    if rounding == "one-ulp drift per round":
        after_round = _drift
    elif rounding == "one-ulp noise per round":
        after_round = _noise()
    else:
        _reversed_decode_add(monkeypatch)
    perturbed = trajectories.compute(after_round=after_round)
    touched = [name for name, tr in perturbed.items() if tr.digest != traces[name].digest]
    # the perturbation reaches the runs (reversed sums: those that mix through decode-add)
    assert len(touched) >= (15 if rounding.startswith("reversed") else len(traces))
    caught = {name: problems for name, tr in perturbed.items()
              if (problems := trajectories.compare_checkpoints(traces[name].checkpoints(),
                                                               tr.checkpoints()))}
    assert not caught


@pytest.mark.slow
def test_other_cpu_kernels_change_the_bits_and_the_platform_not_the_checkpoints(traces, tmp_path,
                                                                              monkeypatch):
    """torch's scalar kernels (instead of this CPU's vector ones) and MKL's compatible code
    path: another machine's rounding, here. The checkpoints still match the recorded ones, and
    the platform differs, so the exact check is skipped there rather than failed."""
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "default")
    monkeypatch.setenv("MKL_CBWR", "COMPATIBLE")
    out = tmp_path / "other-kernels.json"
    res = run_py(["tests/helpers/trajectories.py", "--save", str(out)])
    assert res.returncode == 0, res.stderr
    (other,) = trajectories.load(out)["platforms"]
    assert other["platform"]["env ATEN_CPU_CAPABILITY"] == "default"
    monkeypatch.delenv("ATEN_CPU_CAPABILITY")
    monkeypatch.delenv("MKL_CBWR")
    here = trajectories.platform()
    assert trajectories.recorded_bits({"platforms": [other]}, here) is None
    changed = [name for name, tr in traces.items() if other["hashes"][name] != tr.digest]
    if torch.backends.cpu.get_cpu_capability() != "DEFAULT":  # vector kernels here
        assert changed
    recorded = trajectories.load()["checkpoints"]
    caught = {name: problems for name, cps in trajectories.load(out)["checkpoints"].items()
              if (problems := trajectories.compare_checkpoints(recorded[name], cps))}
    assert not caught


# -- the portable check: what it catches ---------------------------------------------------------
def _scaled_step(monkeypatch, factor: float) -> None:
    """Every scenario's step size (``eta``; ``gamma`` for consensus; the penalty ``c`` of
    ADMM and DLM, whose steps it sets) times ``factor``."""
    real = trajectories.make_algorithm

    def make(name, **hp):
        alg = real(name, **hp)
        key = next((k for k in ("eta", "gamma", "c") if getattr(alg, k, 0)), None)
        if key is None:
            return alg  # no step size (pure consensus with fixed weights)
        return real(name, **{**hp, key: getattr(alg, key) * factor})
    for module in SCENARIO_MODULES:
        monkeypatch.setattr(module, "make_algorithm", make)


def _dropped_message(monkeypatch) -> Callable:
    """One arc's message lost in the first exchange from round 3 on (the engine's own loss
    path: not sent, not counted, not mixed); a scenario whose algorithm refuses lossy
    networks is not built."""
    for module in SCENARIO_MODULES:
        monkeypatch.setattr(module, "Engine", functools.partial(Engine, network="loss=1e-300"))
    original = LossDraws.lost

    def lost(self, t, phase):
        out = np.zeros_like(original(self, t, phase))
        if t >= 3 and out.size and not getattr(self, "_dropped", False):
            out[0] = self._dropped = True
        return out
    monkeypatch.setattr(LossDraws, "lost", lost)

    def build(name, engine_for, world):
        try:
            return engine_for(name, trajectories.NODES, world)
        except ConfigError:
            return None
    return build


def _negate_one_model(engine: Engine, t: int) -> None:
    """Node 1's model negated after round 5, a checkpoint (async-SGP's model is a read-out
    ``s / w`` of its state, which the next activation overwrites: only a checkpoint sees it)."""
    if t == 5:
        engine.nodes[sorted(engine.nodes)[1]].x.neg_()


def _shifted(name, engine_for, world):
    """The scenario with one round run before the recording starts."""
    built = engine_for(name, trajectories.NODES, world)
    if built is not None:
        built[0].step()
    return built


@pytest.mark.slow
@pytest.mark.parametrize("change", ["step size x (1 + 1e-6)", "one message lost",
                                    "one model negated", "shifted by one round"])
def test_real_changes_fail_the_portable_check(traces, monkeypatch, change):
    after_round, build = None, None
    if change.startswith("step"):
        _scaled_step(monkeypatch, 1 + 1e-6)
    elif change == "one message lost":
        build = _dropped_message(monkeypatch)
    elif change == "one model negated":
        after_round = _negate_one_model
    else:
        build = _shifted
    changed = trajectories.compute(after_round=after_round, build=build)
    # the changes that apply: a step size where there is one (not DCD's, ECD's, pairwise
    # gossip's three runs), a loss where the algorithm has one's semantics in rounds (the
    # asynchronous event loop draws its losses apart)
    expected = {"step size x (1 + 1e-6)": len(traces) - 5, "one message lost": 25}.get(
        change, len(traces))
    assert len([n for n, tr in changed.items() if tr.digest != traces[n].digest]) >= expected
    for name, tr in changed.items():
        if tr.digest == traces[name].digest:
            continue
        # the values alone catch it (not only the bytes), by a wide margin
        worst = trajectories.deviation(traces[name].checkpoints(), tr.checkpoints())
        assert worst > 100 * trajectories.RTOL, name
        assert trajectories.compare_checkpoints(traces[name].checkpoints(), tr.checkpoints())


# -- the parts -----------------------------------------------------------------------------------
def _checkpoints(values: list[list[float]], nbytes: list[int] | None = None) -> dict:
    rounds = [1, 2, 5][: len(values)]
    return {"rounds": rounds, "bytes": nbytes or [100 * r for r in rounds], "values": values}


def test_compare_checkpoints_bounds_each_value_by_the_tolerance_times_the_l1_norm():
    want = _checkpoints([[10.0, -3.0, 2.0], [8.0, 1e-12, 0.5]])
    slack = 0.9 * trajectories.RTOL
    near = _checkpoints([[10.0 * (1 + slack), -3.0 + 10.0 * slack, 2.0],
                         [8.0, 1e-12 + 8.0 * slack, 0.5 - 8.0 * slack]])
    assert trajectories.compare_checkpoints(want, near) == []
    # a value near zero is judged against Σ|x|, not against itself
    assert trajectories.compare_checkpoints(want, _checkpoints([[10.0, -3.0, 2.0],
                                                                [8.0, 2e-12, 0.5]])) == []
    far = _checkpoints([[10.0, -3.0, 2.0], [8.0, 1e-12, 0.5 + 8.0 * 2 * trajectories.RTOL]])
    (problem,) = trajectories.compare_checkpoints(want, far)
    assert "round 2" in problem and "value 2" in problem
    nan = _checkpoints([[10.0, math.nan, 2.0], [8.0, 1e-12, 0.5]])
    assert trajectories.compare_checkpoints(want, nan)


def test_compare_checkpoints_wants_the_same_rounds_and_bytes_exactly():
    want = _checkpoints([[10.0, -3.0, 2.0], [8.0, 1.0, 0.5]])
    (problem,) = trajectories.compare_checkpoints(want, _checkpoints(want["values"], [100, 199]))
    assert "round 2" in problem and "199" in problem
    shorter = _checkpoints(want["values"][:1])
    assert "rounds" in trajectories.compare_checkpoints(want, shorter)[0]


def test_snapshot_is_exact_whatever_the_order_of_the_rows_entries():
    """Σ|x| and the projections are correctly rounded sums of exact products: a function of the
    models' bits, not of how a machine adds them."""
    rng = np.random.default_rng(0)
    X = rng.standard_normal((8, 40)) * np.logspace(-8, 8, 40)
    a, p, q = trajectories.snapshot(X)
    assert a == math.fsum(abs(v) for v in X.ravel())
    w = trajectories._golden_weights(X.size, (math.sqrt(5.0) - 1.0) / 2.0)
    assert p == math.fsum((w * X.ravel())[::-1])  # the same value summed backwards
    assert -1.0 <= w.min() and w.max() < 1.0 and p != q


def test_a_platform_not_recorded_is_skipped_with_the_fields_that_differ():
    fields = trajectories.platform()
    data = {"checkpoints": {}, "platforms": [{"platform": fields, "hashes": {"a": "0"}}]}
    assert trajectories.recorded_bits(data, fields) == {"a": "0"}
    key = "env OPENBLAS_CORETYPE"  # a value this platform does not have (it may set one)
    other = dict(fields, cpu="Some Other CPU", **{key: fields.get(key, "") + "Haswell"})
    assert trajectories.recorded_bits(data, other) is None
    reason = trajectories.skip_reason(data, other)
    assert "Some Other CPU" in reason and "OPENBLAS_CORETYPE" in reason
    assert "no platform" in trajectories.skip_reason({"platforms": []}, fields)


def test_the_platform_names_what_the_bits_depend_on(monkeypatch):
    fields = trajectories.platform()
    assert {"cpu", "cpu_vendor", "cpu_id", "cpu_simd", "torch_blas", "libc"} <= set(fields)
    for key in ("llvm_cpu", "torch", "torch_cpu_capability", "numpy", "numba"):
        assert fields[key], key
    monkeypatch.setenv("OPENBLAS_CORETYPE", "Haswell")
    assert trajectories.platform()["env OPENBLAS_CORETYPE"] == "Haswell"


def test_the_file_is_sorted_one_scenario_per_line_and_reads_back(traces, tmp_path):
    data = {"checkpoints": {n: tr.checkpoints() for n, tr in traces.items()},
            "platforms": [{"platform": trajectories.platform(),
                           "hashes": {n: tr.digest for n, tr in traces.items()}}]}
    text = trajectories.dumps(data)
    assert json.loads(text) == data
    lines = text.splitlines()
    for name in traces:  # one line with its checkpoints, one with its hash
        assert sum(line.lstrip().startswith(json.dumps(name)) for line in lines) == 2
    names = [line.split(":")[0].strip() for line in lines if '"rounds"' in line]
    assert names == sorted(names)


def test_save_then_compare_names_the_trajectories_that_changed(tmp_path, capsys, monkeypatch):
    before = tmp_path / "before.json"
    assert trajectories.main(["--save", str(before), "extra", "gossip-none"]) == 0
    assert trajectories.main(["--compare", str(before), "extra", "gossip-none"]) == 0
    assert "0 of 2 trajectories changed" in capsys.readouterr().out
    real = trajectories.trace
    monkeypatch.setattr(trajectories, "trace", lambda engine, rounds, after_round=None:
                        real(engine, rounds, _negate_one_model))
    assert trajectories.main(["--compare", str(before), "extra", "gossip-none"]) == 1
    out = capsys.readouterr().out
    assert "DIFF  extra" in out and "DIFF  gossip-none" in out and "2 of 2" in out


def test_write_records_both_and_add_platform_refuses_changed_numbers(tmp_path, capsys,
                                                                     monkeypatch):
    golden = tmp_path / "golden.json"
    names = ["extra", "gossip-none"]
    monkeypatch.setattr(trajectories, "scenarios", lambda real=trajectories.scenarios: {
        n: f for n, f in real().items() if n in names})
    assert trajectories.main(["--write", "--golden", str(golden)]) == 0
    data = trajectories.load(golden)
    assert set(data["checkpoints"]) == set(names)
    (entry,) = data["platforms"]
    assert entry["platform"] == trajectories.platform() and set(entry["hashes"]) == set(names)
    # another platform's set is kept by --add-platform, dropped by --write
    data["platforms"].append({"platform": {"cpu": "elsewhere"}, "hashes": entry["hashes"]})
    golden.write_text(trajectories.dumps(data))
    assert trajectories.main(["--add-platform", "--golden", str(golden)]) == 0
    assert len(trajectories.load(golden)["platforms"]) == 2
    real = trajectories.trace
    monkeypatch.setattr(trajectories, "trace", lambda engine, rounds, after_round=None:
                        real(engine, rounds, _negate_one_model))
    assert trajectories.main(["--add-platform", "--golden", str(golden)]) == 1
    assert "refused" in capsys.readouterr().out
    assert len(trajectories.load(golden)["platforms"]) == 2
    assert trajectories.main(["--write", "--golden", str(golden)]) == 0
    assert len(trajectories.load(golden)["platforms"]) == 1
