"""Federated methods on the star: each against its float64 matrix-form reference, the client
sampler, bits up and down, resume, and the refusals before round 1."""

from __future__ import annotations

import io
import re

import networkx as nx
import numpy as np
import pytest
import torch

import topologies
from gossip.algorithms import make_algorithm
from gossip.core.star import ClientSampler
from gossip.engine import Engine
from gossip.errors import ConfigError
from tests.helpers.algorithm_setup import row_compressor
from tests.helpers.reference_federated import federated
from tests.helpers.star_problem import GRADS, PROBLEM, STAR, X0, D, N


def engine(name: str, spec: str = "none", seed: int = 11, **hp) -> Engine:
    return Engine(make_algorithm(name, **hp), STAR, lambda i: torch.from_numpy(X0), compressor=spec,
                  seed=seed, oracles=lambda i, gen: PROBLEM.oracle(i - 1, gen) if i else None)


def server_models(eng: Engine, rounds: int) -> list[np.ndarray]:
    out = [eng.nodes[0].x.numpy().copy()]
    for _ in range(rounds):
        eng.step()
        out.append(eng.nodes[0].x.numpy().copy())
    return out


def sampler_of(eng: Engine):
    link = eng.block.workspace["link"]
    return link.sampler.sample


def check(name: str, rounds: int = 12, spec: str = "none", ref: dict | None = None, **hp) -> None:
    eng = engine(name, spec, **hp)
    ours = server_models(eng, rounds)
    kw = {k: hp[k] for k in ("local_steps", "eta", "server_lr", "beta1", "beta2", "tau",
                             "weight_decay", "mu") if k in hp}
    theirs = federated(X0, GRADS, rounds, sampler_of(eng), **kw, **(ref or {}))
    for r, (a, b) in enumerate(zip(ours, theirs, strict=True)):
        np.testing.assert_allclose(a, b, atol=1e-12, rtol=0, err_msg=f"round {r}")
    assert np.abs(ours[-1] - ours[0]).max() > 1e-3  # the model moved: not a vacuous equality


# ---- each method against its rule -------------------------------------------------------------


def test_fedavg_matches_reference():
    check("fedavg", clients_per_round=3, local_steps=3, eta=0.05)


@pytest.mark.parametrize("name, ref", [("fedavg", {}), ("scaffold", {"scaffold": True})])
def test_one_local_step_count_per_client_matches_reference(name, ref):
    """Clients with K_i = 1..7 local steps (E epochs over unequal data: ⌈E·n_i/B⌉ each)."""
    check(name, clients_per_round=4, local_steps=[1, 2, 3, 4, 5, 6, 7], eta=0.05, ref=ref)
    with pytest.raises(ConfigError, match="gives 3 clients their K, the star has 7"):
        engine("fedavg", local_steps=[1, 2, 3])
    with pytest.raises(ConfigError, match="at least one local step"):
        make_algorithm("fedavg", local_steps=[2, 0, 1])


def test_fedavg_server_lr_and_replacement_and_availability():
    check("fedavg", clients_per_round=4, local_steps=2, eta=0.05, server_lr=0.7,
          sampling="replacement", availability=0.6)


def test_fedavg_with_weighted_sampling_matches_reference():
    check("fedavg", clients_per_round=3, local_steps=2, eta=0.05, sampling="weighted",
          client_weights=[1.0, 5.0, 1.0, 2.0, 8.0, 1.0, 3.0])


def test_fedavg_data_weighted_average_matches_reference():
    sizes = [20.0, 5.0, 40.0, 10.0, 20.0, 80.0, 15.0]
    check("fedavg", clients_per_round=3, local_steps=2, eta=0.05, aggregation="data",
          client_weights=sizes, ref={"data_weights": sizes})


def test_fedprox_matches_reference():
    check("fedprox", clients_per_round=3, local_steps=4, eta=0.05, mu=0.5)


@pytest.mark.parametrize("server", ["adam", "yogi", "adagrad", "adamw"])
def test_server_optimizers_match_reference(server):
    hp = dict(clients_per_round=3, local_steps=2, eta=0.05, server_lr=0.05, beta1=0.8,
              beta2=0.95, tau=1e-2)
    if server == "adamw":
        hp["weight_decay"] = 0.1
    check("fedavg", server_optimizer=server, ref={"server": server}, **hp)


@pytest.mark.parametrize("name,server", [("fedadam", "adam"), ("fedyogi", "yogi"),
                                         ("fedadagrad", "adagrad")])
def test_named_adaptive_methods_are_fedavg_with_their_server(name, server):
    check(name, clients_per_round=3, local_steps=2, eta=0.05, server_lr=0.05,
          ref={"server": server})


def test_scaffold_matches_reference_and_removes_drift():
    check("scaffold", rounds=15, clients_per_round=4, local_steps=5, eta=0.05,
          ref={"scaffold": True})
    # full participation, many local steps: SCAFFOLD reaches x*, FedAvg stalls at a drifted point
    x_star = PROBLEM.solution().numpy()
    dist = {}
    for name in ("fedavg", "scaffold"):
        x = server_models(engine(name, local_steps=10, eta=0.05), 150)[-1]
        dist[name] = float(((x - x_star) ** 2).sum() / (x_star**2).sum())
    assert dist["scaffold"] < 1e-12 < 1e-4 < dist["fedavg"], dist


@pytest.mark.parametrize("memory", ["ef21", None])
def test_compressed_uplink_matches_reference(memory):
    comp = row_compressor("topk:0.5")
    check("fedavg", spec="topk:0.5", clients_per_round=3, local_steps=2, eta=0.05,
          uplink_memory=memory, ref={"compress": lambda v: comp(0, v), "ef21": memory == "ef21"})


def test_compressed_scaffold_with_adam_matches_reference():
    comp = row_compressor("topk:0.5")
    check("scaffold", spec="topk:0.5", clients_per_round=3, local_steps=2, eta=0.05,
          server_optimizer="adam", server_lr=0.05,
          ref={"server": "adam", "scaffold": True, "compress": lambda v: comp(0, v), "ef21": True})


@pytest.mark.parametrize("name,ref", [("fedavg", {}), ("scaffold", {"scaffold": True})])
def test_compressed_downlink_matches_reference(name, ref):
    down, up = row_compressor("topk:0.5"), row_compressor("sign")
    check(name, spec="sign", clients_per_round=3, local_steps=2, eta=0.05,
          downlink_compressor="topk:0.5",
          ref=ref | {"compress": lambda v: up(0, v), "ef21": True,
                     "down_compress": lambda v: down(0, v)})


def test_compressed_downlink_counts_its_bits():
    exact = engine("fedavg", clients_per_round=3, local_steps=1, eta=0.05)
    small = engine("fedavg", clients_per_round=3, local_steps=1, eta=0.05,
                   downlink_compressor="topk:0.5")
    for eng in (exact, small):
        eng.run(4, log_every=4)
    a, b = exact.record(), small.record()
    assert a["bits_up_per_client"] == b["bits_up_per_client"]
    nbytes = small.block.workspace["link"].downlink.nbytes_rows(torch.zeros(D, dtype=torch.float64))
    assert b["bits_down_per_client"] == 4 * 3 * 8 * nbytes / (N - 1)
    assert b["bits_down_per_client"] < a["bits_down_per_client"]


def test_ef21_memory_beats_plain_compression():
    """With top-k at 1/6 of the entries, the EF21 memories reach the full-participation fixed
    point of exact FedAvg; the memoryless uplink drops most of every delta and stays away."""
    def final(spec, memory):
        return server_models(engine("fedavg", spec, local_steps=2, eta=0.05, uplink_memory=memory),
                             300)[-1]

    exact = final("none", None)
    ef = np.abs(final("topk:1", "ef21") - exact).max()
    plain = np.abs(final("topk:1", None) - exact).max()
    assert ef < 1e-8 < 1e-3 < plain, (ef, plain)


# ---- sampling, bits --------------------------------------------------------------------------


def test_sampler_is_keyed_by_seed_and_round():
    a, b = ClientSampler(5, 20, 6), ClientSampler(5, 20, 6)
    rounds = [a.sample(t) for t in range(1, 400)]
    assert rounds[7] == b.sample(8) and a.sample(8) == rounds[7]  # no position, only (seed, round)
    assert ClientSampler(6, 20, 6).sample(8) != rounds[7]
    assert all(len(s) == 6 == len(set(s)) and set(s) <= set(range(1, 21)) for s in rounds)
    counts = np.bincount(np.concatenate(rounds), minlength=21)[1:]
    expected = 399 * 6 / 20
    assert np.abs(counts - expected).max() < 5 * np.sqrt(expected)  # uniform
    draws = [ClientSampler(5, 20, 6, "replacement").sample(t) for t in range(1, 200)]
    assert all(len(s) == 6 for s in draws) and any(len(set(s)) < 6 for s in draws)
    off = [ClientSampler(5, 20, 20, availability=0.3).sample(t) for t in range(1, 200)]
    assert 0.2 < np.mean([len(s) for s in off]) / 20 < 0.4
    w = np.arange(1.0, 21.0)  # client i weighs i: drawn i times as often as client 1
    heavy = ClientSampler(5, 20, 4, "weighted", weights=w)
    counts = np.bincount(np.concatenate([heavy.sample(t) for t in range(1, 2001)]), minlength=21)[1:]
    expected = 2000 * 4 * w / w.sum()
    assert np.all(np.abs(counts - expected) < 5 * np.sqrt(expected) + 1), counts


def test_only_sampled_clients_send_and_bits_are_split():
    eng = engine("fedavg", clients_per_round=2, local_steps=1, eta=0.05)
    sample = sampler_of(eng)
    msg_bits = 8 * (8 + 8 * D)  # header + D float64 values, either way
    sent = np.zeros(N)
    for t in range(1, 6):
        x_before = {i: eng.nodes[i].x.clone() for i in range(1, N)}
        eng.step()
        chosen = sample(t)
        for i in range(1, N):
            moved = not torch.equal(eng.nodes[i].x, x_before[i])
            assert moved == (i in chosen), (t, i)  # unsampled clients do not compute
        sent[chosen] += msg_bits
        sent[0] += msg_bits * len(chosen)
    rec = eng.record()
    bits = eng.bytes_sent() * 8
    np.testing.assert_array_equal(bits, sent)  # the unsampled sent nothing
    assert rec["bits_up_per_client"] == sent[1:].mean()
    assert rec["bits_down_per_client"] == sent[0] / (N - 1)


def test_metrics_read_the_server_model():
    eng = engine("fedavg", clients_per_round=2, local_steps=1, eta=0.05)
    eng.step()
    assert torch.equal(eng.mean_model(), eng.nodes[0].x)


# ---- resume ----------------------------------------------------------------------------------


def test_resume_equals_uninterrupted_run_with_sampling():
    hp = dict(clients_per_round=3, local_steps=2, eta=0.05, server_optimizer="adam",
              server_lr=0.05, sampling="replacement", availability=0.8,
              downlink_compressor="qsgd:4bit")
    whole = engine("scaffold", "topk:0.5", **hp)
    whole.run(10, log_every=10)
    first = engine("scaffold", "topk:0.5", **hp)
    first.run(4, log_every=4)
    buf = io.BytesIO()
    torch.save({"nodes": first.node_state_dicts(), "run": first.run_state_dict()}, buf)
    buf.seek(0)
    saved = torch.load(buf, weights_only=True)
    resumed = engine("scaffold", "topk:0.5", **hp)
    resumed.load_state_dicts(saved["nodes"], saved["run"])
    resumed.run(6, log_every=6)
    for i in range(N):
        assert torch.equal(resumed.nodes[i].x, whole.nodes[i].x), i
    assert resumed.record()["bits_up_per_client"] == whole.record()["bits_up_per_client"]


# ---- refused before round 1 --------------------------------------------------------------------


def test_scaffold_refuses_the_data_weighted_average():
    with pytest.raises(ConfigError, match="scaffold averages its clients plainly"):
        engine("scaffold", aggregation="data", client_weights=[1.0] * 7)


@pytest.mark.parametrize("hp,spec,topo,says", [
    ({"clients_per_round": 8}, "none", STAR, "clients_per_round = 8 (--clients-per-round) but the star has 7 clients"),
    ({"local_steps": 0}, "none", STAR, "local_steps = 0"),
    ({"server_optimizer": "adamax"}, "none", STAR, "server_optimizer 'adamax' (--server-optimizer) does not exist"),
    ({}, "lowrank:1", STAR, "cannot do: use a stateless one"),
    ({}, "none", topologies.build("ring", N), "runs on a star whose node 0 is the server"),
    ({"sampling": "importance"}, "none", STAR, "sampling 'importance' is not one of"),
    ({"sampling": "weighted"}, "none", STAR, "sampling 'weighted' needs client_weights: 7 positive"),
    ({"sampling": "weighted", "client_weights": [1.0] * 6}, "none", STAR, "got 6"),
    ({"downlink_compressor": "topq:3"}, "none", STAR, "downlink_compressor: "),
    ({"aggregation": "data"}, "none", STAR, "aggregation 'data' needs client_weights: 7 positive"),
    ({"aggregation": "data", "sampling": "replacement"}, "none", STAR, "use aggregation 'mean'"),
    ({"downlink_compressor": "lowrank:1"}, "none", STAR, "keeps state per node"),
    ({}, "none", topologies.Topology(nx.relabel_nodes(nx.star_graph(N - 1), {0: 3, 3: 0}),
                                     name="star-hub-3"), "not on 'star-hub-3'"),
])
def test_bad_input_is_one_clear_error(hp, spec, topo, says):
    with pytest.raises(ConfigError, match=re.escape(says)):
        Engine(make_algorithm("fedavg", **hp), topo, lambda i: torch.from_numpy(X0),
               compressor=spec, oracles=lambda i, gen: PROBLEM.oracle(i - 1, gen) if i else None)


def test_scaffold_server_c_stays_the_clients_mean_under_compression():
    eng = engine("scaffold", "topk:0.5", clients_per_round=3, local_steps=2, eta=0.05)
    eng.run(10, log_every=10)
    c = eng.block.state["scaffold.c"]
    assert float(c[0].abs().max()) > 1e-3
    np.testing.assert_allclose(c[0], c[1:].mean(0), atol=1e-12, rtol=0)


# ---- the script -------------------------------------------------------------------------------


def test_optimize_script_runs_federated_on_the_star(tmp_path):
    from gossip.metrics import read_jsonl
    from tests.helpers.launch import script

    out = tmp_path / "fed.jsonl"
    rows = script("optimize").main([
        "--algorithm", "scaffold", "--nodes", "6", "--clients-per-round", "3", "--local-steps",
        "3", "--compressor", "none", "--iterations", "40", "--log-every", "20", "--dim", "8",
        "--samples-per-node", "20", "--out", str(out)])
    assert rows[0]["status"] == "ok" and rows[0]["final"] < 1e-3
    recs = [r for r in read_jsonl(out) if r["type"] == "round"]
    config = read_jsonl(out)[0]
    assert config["topology"]["name"] == "star" and config["hparams"]["clients_per_round"] == 3
    msg = 8 * (8 + 2 * 8 * 8)  # (x, c) or (Δy, Δc) in float64, with the header
    assert recs[-1]["bits_up_per_client"] == 40 * 3 * msg / 5
    assert recs[-1]["bits_down_per_client"] == 40 * 3 * msg / 5


def test_optimize_script_refuses_bad_federated_input_in_one_line():
    from tests.helpers.launch import run_py

    res = run_py(["experiments/optimize.py", "--algorithm", "fedavg", "--nodes", "5",
                  "--clients-per-round", "5", "--iterations", "2", "--out", "/dev/null"])
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert lines == ["error: clients_per_round = 5 (--clients-per-round) but the star has 4 "
                     "clients: give at most 4 (or more nodes)"], res.stderr


def test_optimize_resume_after_a_crash_equals_uninterrupted_with_sampling(tmp_path, monkeypatch):
    """20 rounds, a crash, --resume for 20 more: the log of 40 rounds in one go (the sample of
    every round, the EF21 memories, the server's moments)."""
    import json

    from tests.helpers.launch import script

    def records(path) -> list[dict]:
        recs = [json.loads(line) for line in open(path)]
        return [{k: v for k, v in r.items() if not k.endswith("_s")} for r in recs
                if r["type"] == "round"]

    args = ["--algorithm", "fedadam", "--compressor", "topk:0.3", "--nodes", "7", "--dim", "10",
            "--samples-per-node", "20", "--clients-per-round", "3", "--sampling", "replacement",
            "--availability", "0.8", "--local-steps", "2", "--estimator", "sgd", "--batch-size",
            "2", "--iterations", "40", "--log-every", "5"]
    main = script("optimize").main
    full, cut, ck = tmp_path / "full.jsonl", tmp_path / "cut.jsonl", tmp_path / "ck"
    main([*args, "--out", str(full)])
    original = Engine.step

    def crash_after_round_20(self, *a, **kw):
        if self.round == 20:
            raise KeyboardInterrupt
        original(self, *a, **kw)

    monkeypatch.setattr(Engine, "step", crash_after_round_20)
    with pytest.raises(KeyboardInterrupt):
        main([*args, "--out", str(cut), "--checkpoint-dir", str(ck), "--checkpoint-every", "10"])
    monkeypatch.undo()
    main([*args, "--out", str(cut), "--resume", str(ck)])
    ours, whole = records(cut), records(full)
    assert len(whole) == 9 and whole[-1]["bits_up_per_client"] > 0
    assert ours == whole


def test_train_script_trains_federated_with_the_server_holding_no_data(tmp_path):
    from gossip.metrics import read_jsonl
    from tests.helpers.launch import script

    out = tmp_path / "train.jsonl"
    script("train").main(["--algorithm", "fedavg", "--data", "digits", "--nodes", "5",
                          "--clients-per-round", "2", "--local-steps", "3", "--lr", "0.1",
                          "--rounds", "30", "--log-every", "15", "--hidden", "32",
                          "--out", str(out)])
    config, *recs = read_jsonl(out)
    sizes = config["partition_sizes"]
    assert sizes[0] == 0 and min(sizes[1:]) > 0  # the clients hold the data, the server none
    rounds = [r for r in recs if r["type"] == "round"]
    assert rounds[-1]["test_accuracy"] > 0.6 > rounds[0]["test_accuracy"]
    assert rounds[-1]["bits_up_per_client"] > 0 and rounds[-1]["bits_down_per_client"] > 0


def test_optimize_compare_refuses_mixing_the_star_with_a_decentralized_graph():
    from tests.helpers.launch import script

    with pytest.raises(SystemExit, match="mixes federated algorithms"):
        script("optimize").main(["--compare", "fedavg@none", "dpsgd@none", "--iterations", "1",
                                 "--out", "/dev/null"])
    with pytest.raises(SystemExit, match="--local-steps does not apply to choco"):
        script("optimize").main(["--algorithm", "choco", "--local-steps", "3", "--iterations",
                                 "1", "--out", "/dev/null"])


def test_clients_step_with_their_torch_optimizer():
    """A client's local steps go through its own torch.optim optimizer: plain SGD at lr gives
    the bits of the algorithm's own step eta = lr, momentum (kept by the client from round to
    round) another run; SCAFFOLD, whose control variates assume plain steps, refuses one."""
    import torch

    import topologies
    from gossip.errors import ConfigError
    from gossip.training import MLP, DecentralizedTrainer, digits

    train, _ = digits()

    def run(optimizer, name="fedavg", **hp):
        torch.manual_seed(0)
        trainer = DecentralizedTrainer(
            MLP(64, 10, (16,)), train, topology=topologies.build("star", 5),
            algorithm=make_algorithm(name, clients_per_round=2, local_steps=3, **hp),
            optimizer=optimizer, batch_size=16, seed=1)
        trainer.fit(rounds=4, log_every=4)
        return trainer.engine.block.x.clone()

    plain = run(None, eta=0.1)
    assert torch.equal(run(lambda p: torch.optim.SGD(p, lr=0.1)), plain)
    assert not torch.equal(run(lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9)), plain)
    with pytest.raises(ConfigError, match="scaffold takes the gradient directly"):
        run(lambda p: torch.optim.SGD(p, lr=0.1), name="scaffold")


def test_train_script_local_epochs_give_each_client_its_steps(tmp_path):
    """--local-epochs E: client i takes ⌈E·n_i/B⌉ local steps over its share of the data."""
    import math

    from gossip.metrics import read_jsonl
    from tests.helpers.launch import script

    out = tmp_path / "train.jsonl"
    script("train").main(["--algorithm", "fedavg", "--data", "digits", "--nodes", "5",
                          "--partition", "dirichlet:0.3", "--local-epochs", "0.5",
                          "--batch-size", "16", "--rounds", "2", "--hidden", "16",
                          "--out", str(out)])
    config = read_jsonl(out)[0]
    sizes = config["partition_sizes"][1:]
    want = [max(1, math.ceil(0.5 * n / 16)) for n in sizes]
    assert config["hparams"]["local_steps"] == want and len(set(want)) > 1
    with pytest.raises(SystemExit, match="not both"):
        script("train").main(["--algorithm", "fedavg", "--nodes", "5", "--local-epochs", "1",
                              "--local-steps", "2", "--rounds", "1"])
