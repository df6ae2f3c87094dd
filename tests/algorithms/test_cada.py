"""CADA and G-CADA on the star: the engine against the float64 reference of the paper's rules,
the skips counted from what was sent, resume, and the refusals (docs/algorithms/cada.md)."""

from __future__ import annotations

import io
import re

import numpy as np
import pytest
import torch

import topologies
from gossip.algorithms import make_algorithm
from gossip.engine import Engine
from gossip.errors import ConfigError
from tests.helpers.algorithm_setup import row_compressor
from tests.helpers.reference_federated import cada
from tests.helpers.star_problem import GRADS, PROBLEM, STAR, X0, D, N


def engine(name: str, spec: str = "none", estimator: str = "full", **hp) -> Engine:
    return Engine(make_algorithm(name, **hp), STAR, lambda i: torch.from_numpy(X0),
                  compressor=spec, seed=11,
                  oracles=lambda i, gen: PROBLEM.oracle(i - 1, gen, estimator, batch_size=4)
                  if i else None)


def run(eng: Engine, rounds: int) -> tuple[list[np.ndarray], list[set[int]]]:
    """The server model after every round and each round's uploaders, read from the counts."""
    models, uploads = [eng.nodes[0].x.numpy().copy()], []
    for _ in range(rounds):
        before = eng.block.state["cada.uploads"].clone()
        eng.step()
        moved = eng.block.state["cada.uploads"] - before
        uploads.append({eng.block.ids[r] for r in range(eng.block.m) if moved[r] == 1.0})
        models.append(eng.nodes[0].x.numpy().copy())
    return models, uploads


def check(name: str, rounds: int = 30, spec: str = "none", compress=None, **hp) -> list[set[int]]:
    full = dict(c=1.0, d_max=10, max_delay=50, server_lr=0.05) | hp
    ours, ours_up = run(engine(name, spec, **full), rounds)
    theirs, theirs_up = cada(X0, GRADS, rounds, rule=full.pop("rule", "g-cada"),
                             compress=compress, **full)
    assert ours_up == theirs_up
    for r, (a, b) in enumerate(zip(ours, theirs, strict=True)):
        np.testing.assert_allclose(a, b, atol=1e-12, rtol=0, err_msg=f"round {r}")
    assert np.abs(ours[-1] - ours[0]).max() > 1e-2  # the model moved: not a vacuous equality
    skipped = sum(N - 1 - len(u) for u in ours_up)
    assert 0 < skipped < (N - 1) * rounds  # the rule both skipped and uploaded
    return ours_up


# ---- each rule against the paper's ------------------------------------------------------------


@pytest.mark.parametrize("rule", ["cada1", "cada2"])
def test_cada_rules_match_reference(rule):
    check("cada", rule=rule, c=0.5, max_delay=7)


def test_g_cada_matches_reference():
    check("g-cada", c=0.5, d_max=4, max_delay=9)


def test_compressed_uploads_match_reference_with_ef21_copies():
    comp = row_compressor("topk:0.5")
    check("cada", spec="topk:0.5", compress=lambda v: comp(0, v), rule="cada2", c=0.2)


def test_max_delay_bounds_the_skips():
    ups = check("cada", rule="cada2", c=1e6, max_delay=4, rounds=20)  # the rule alone: never
    for i in range(1, N):
        rounds = [t for t, u in enumerate(ups, 1) if i in u]
        assert rounds == list(range(1, 21, 4)), (i, rounds)


@pytest.mark.parametrize("hp", [{"c": 0.0}, {"max_delay": 1, "c": 1e6}])
def test_every_worker_uploading_is_fedadam_on_one_gradient_step(hp):
    """c = 0 (a gradient that moved is sent) or D = 1: Adam at the server on every worker's
    fresh gradient, which is FedAdam with one local step of η = 1 (Δ = −mean g)."""
    ours, ups = run(engine("cada", rule="cada2", server_lr=0.05, **hp), 15)
    fed = engine("fedadam", local_steps=1, eta=1.0, server_lr=0.05)
    for r in range(1, 16):
        fed.step()
        np.testing.assert_allclose(ours[r], fed.nodes[0].x.numpy(), atol=1e-12, rtol=0)
    assert all(u == set(range(1, N)) for u in ups)


# ---- what is sent and logged ------------------------------------------------------------------


def test_bits_and_skip_rate_count_what_was_sent():
    eng = engine("g-cada", c=2.0, server_lr=0.05)
    _, ups = run(eng, 25)
    rec = eng.record()
    uploads = sum(len(u) for u in ups)
    assert rec["uploads"] == uploads and rec["uploads_skipped"] == 25 * (N - 1) - uploads
    assert rec["skip_rate"] == rec["uploads_skipped"] / (25 * (N - 1)) > 0.05
    grad_msg, flag = 8 * (8 + 8 * D), 8  # a float64 gradient with its header; a one-byte flag
    bits = eng.bytes_sent() * 8
    for i in range(1, N):  # a worker sends its flag every round, its gradient when it uploads
        assert bits[i] == 25 * flag + grad_msg * sum(i in u for u in ups), i
    assert rec["bits_up_per_client"] == float(np.mean(bits[1:]))
    assert bits[0] == 25 * (N - 1) * grad_msg  # θ down to every worker, every round


def test_stochastic_cada_skips_and_reaches_adams_loss():
    """With mini-batches the same-sample rules still skip, the one-gradient rule sees the
    sampling noise (it compares two samples) and skips less, and every model gets as close
    to x* as FedAdam's with every worker uploading."""
    x_star = PROBLEM.solution().numpy()
    dist, skip = {}, {}
    for key, name, hp in (("cada1", "cada", {"rule": "cada1", "max_delay": 10}),
                          ("cada2", "cada", {"rule": "cada2"}), ("g-cada", "g-cada", {}),
                          ("fedadam", "fedadam", {"local_steps": 1, "eta": 1.0})):
        eng = engine(name, estimator="sgd", server_lr=0.02,
                     **({"c": 1.0} if "cada" in name else {}), **hp)
        rec = eng.run(300, log_every=300)[-1]
        dist[key] = float(((eng.nodes[0].x.numpy() - x_star) ** 2).sum() / (x_star**2).sum())
        skip[key] = rec.get("skip_rate", 0.0)
    assert skip["cada1"] > 0.02 and skip["cada2"] > 0.1 and skip["g-cada"] < skip["cada2"], skip
    assert max(dist.values()) < 2 * dist["fedadam"] < 0.01, dist


# ---- resume -------------------------------------------------------------------------------------


@pytest.mark.parametrize("name,hp", [("cada", {"rule": "cada1", "max_delay": 5}),
                                     ("cada", {"rule": "cada2"}), ("g-cada", {"c": 1000.0})])
def test_resume_equals_uninterrupted_run(name, hp):
    hp = dict(c=0.5, server_lr=0.05) | hp
    whole = engine(name, "topk:0.5", "sgd", **hp)
    whole.run(12, log_every=12)
    first = engine(name, "topk:0.5", "sgd", **hp)
    first.run(5, log_every=5)
    buf = io.BytesIO()
    torch.save({"nodes": first.node_state_dicts(), "run": first.run_state_dict()}, buf)
    buf.seek(0)
    saved = torch.load(buf, weights_only=True)
    resumed = engine(name, "topk:0.5", "sgd", **hp)
    resumed.load_state_dicts(saved["nodes"], saved["run"])
    resumed.run(7, log_every=7)
    for i in range(N):
        assert torch.equal(resumed.nodes[i].x, whole.nodes[i].x), i
    a, b = resumed.record(), whole.record()
    assert 0 < a["uploads_skipped"] == b["uploads_skipped"]
    assert a["bits_up_per_client"] == b["bits_up_per_client"]


# ---- refused before round 1 ---------------------------------------------------------------------


@pytest.mark.parametrize("name,hp,says", [
    ("cada", {"rule": "cada3"}, "rule 'cada3' is not one of cada1, cada2"),
    ("cada", {"d_max": 0}, "d_max = 0: a whole number >= 1"),
    ("g-cada", {"max_delay": 2.5}, "max_delay = 2.5: a whole number >= 1"),
    ("cada", {"c": -1.0}, "c = -1.0"),
    ("g-cada", {"server_lr": 0.0}, "server_lr"),
    ("cada", {"beta2": 1.0}, "beta2"),
])
def test_bad_hyper_parameters_are_one_clear_error(name, hp, says):
    with pytest.raises(ConfigError, match=re.escape(says)) as err:
        make_algorithm(name, **hp)
    assert "\n" not in str(err.value)


def test_two_point_rules_refuse_an_oracle_with_tables_and_g_cada_takes_it():
    with pytest.raises(ConfigError, match="evaluates one mini-batch at two points.*'saga'"):
        engine("cada", estimator="saga", rule="cada2")
    engine("g-cada", estimator="saga").run(3, log_every=3)


def test_cada_refuses_a_graph_other_than_the_star():
    with pytest.raises(ConfigError, match="star"):
        Engine(make_algorithm("cada"), topologies.build("ring", N), lambda i: torch.from_numpy(X0),
               oracles=lambda i, gen: PROBLEM.oracle(i - 1, gen) if i else None)


# ---- the scripts ----------------------------------------------------------------------------------


def test_optimize_script_logs_the_skips(tmp_path):
    from gossip.metrics import read_jsonl
    from tests.helpers.launch import script

    out = tmp_path / "cada.jsonl"
    script("optimize").main([
        "--algorithm", "cada", "--hparam", "rule=cada1", "c=0.5", "max_delay=5", "--nodes", "6",
        "--compressor", "none", "--estimator", "sgd", "--batch-size", "4", "--server-lr", "0.02",
        "--iterations", "40", "--log-every", "20", "--dim", "8", "--samples-per-node", "20",
        "--out", str(out)])
    config, *recs = read_jsonl(out)
    assert config["topology"]["name"] == "star" and config["hparams"]["rule"] == "cada1"
    last = [r for r in recs if r["type"] == "round"][-1]
    assert last["uploads"] + last["uploads_skipped"] == 40 * 5 and last["uploads_skipped"] > 0
    assert last["skip_rate"] == last["uploads_skipped"] / 200


def test_train_script_trains_g_cada_and_refuses_cada_in_one_line(tmp_path):
    from gossip.metrics import read_jsonl
    from tests.helpers.launch import run_py, script

    out = tmp_path / "train.jsonl"
    script("train").main(["--algorithm", "g-cada", "--data", "digits", "--nodes", "5",
                          "--server-lr", "0.01", "--rounds", "30", "--log-every", "30",
                          "--hidden", "32", "--out", str(out)])
    rounds = [r for r in read_jsonl(out) if r["type"] == "round"]
    assert rounds[-1]["test_accuracy"] > 0.6 > rounds[0]["test_accuracy"]
    assert "skip_rate" in rounds[-1]
    res = run_py(["experiments/train.py", "--algorithm", "cada", "--data", "digits", "--nodes",
                  "5", "--rounds", "2", "--hidden", "32", "--out", "/dev/null"])
    assert res.returncode != 0
    assert res.stderr.strip().splitlines() == [
        "error: cada rule cada2 evaluates one mini-batch at two points, which the 'ModelOracle' "
        "oracle cannot do: use an sgd or full estimator (optimize.py --estimator), or g-cada "
        "(one gradient a round; it trains models)"], res.stderr
