"""FedAdamW and FedAdam-SSM on the star: each against its float64 reference, the reductions
(FedAdamW without its correction, decay and shared v is FedAvg with clients on torch's AdamW;
FedAdam-SSM keeping every entry is the dense form, whichever mask), what the server keeps,
the bits each sends, resume, and the refusals."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch

from gossip.algorithms import make_algorithm
from gossip.engine import Engine
from gossip.errors import ConfigError
from tests.helpers.reference_federated import fedadam_ssm, fedadamw, top_set
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


def assert_close(ours: list[np.ndarray], theirs: list[np.ndarray], atol: float = 1e-12) -> None:
    for r, (a, b) in enumerate(zip(ours, theirs, strict=True)):
        np.testing.assert_allclose(a, b, atol=atol, rtol=0, err_msg=f"round {r}")
    assert np.abs(ours[-1] - ours[0]).max() > 1e-2  # the model moved: not a vacuous equality


def ref(hp: dict) -> dict:
    """The hyper-parameters a reference takes (the sample comes as a function)."""
    return {k: v for k, v in hp.items() if k not in ("clients_per_round", "mask")}


def sample_of(eng: Engine):
    return eng.block.workspace["link"].sampler.sample


# ---- FedAdamW -----------------------------------------------------------------------------------


@pytest.mark.parametrize("hp", [
    dict(weight_decay=0.1, gamma=0.5, clip=1.0),  # clipping active: the gradients exceed 1
    dict(weight_decay=0.0, gamma=2.0, clip=None, server_lr=0.7),
])
def test_fedadamw_matches_reference(hp):
    common = dict(clients_per_round=3, local_steps=3, eta=0.05)
    eng = engine("fedadamw", **common, **hp)
    ours = server_models(eng, 12)
    assert_close(ours, fedadamw(X0, GRADS, 12, sample_of(eng), **ref(common | hp)))


def client_adamw_reference(sample, rounds: int, K: int, eta: float, weight_decay: float,
                           clip: float | None) -> list[np.ndarray]:
    """FedAvg whose sampled clients each run K steps of a fresh ``torch.optim.AdamW`` from the
    server's model (clipped by ``torch.nn.utils.clip_grad_norm_``); the server adds the mean
    change."""
    x = torch.from_numpy(X0.copy())
    out = [x.numpy().copy()]
    for r in range(1, rounds + 1):
        S = sample(r)
        ends = {}
        for i in sorted(set(S)):
            y = x.clone().requires_grad_(True)
            opt = torch.optim.AdamW([y], lr=eta, weight_decay=weight_decay)
            for _ in range(K):
                opt.zero_grad()
                y.grad = PROBLEM.grad_full(i - 1, y.detach())
                if clip is not None:
                    torch.nn.utils.clip_grad_norm_([y], clip)
                opt.step()
            ends[i] = y.detach() - x
        if S:
            x = x + sum(ends[i] for i in S) / len(S)
        out.append(x.numpy().copy())
    return out


@pytest.mark.parametrize("weight_decay,clip", [(0.0, None), (0.1, 1.0)])
def test_fedadamw_without_its_parts_is_fedavg_with_client_adamw(weight_decay, clip):
    """γ = 0, v from zero and the local step count: every client is a fresh torch AdamW."""
    eng = engine("fedadamw", clients_per_round=3, local_steps=4, eta=0.05, gamma=0.0,
                 weight_decay=weight_decay, clip=clip, v_start="zero", step_count="local")
    ours = server_models(eng, 10)
    assert_close(ours, client_adamw_reference(sample_of(eng), 10, 4, 0.05, weight_decay, clip))
    # and each of the method's parts changes the run
    for part in (dict(gamma=0.5), dict(v_start="server"), dict(step_count="global")):
        other = engine("fedadamw", clients_per_round=3, local_steps=4, eta=0.05,
                       weight_decay=weight_decay, clip=clip,
                       **(dict(gamma=0.0, v_start="zero", step_count="local") | part))
        assert np.abs(server_models(other, 10)[-1] - ours[-1]).max() > 1e-4, part


def test_fedadamw_server_keeps_the_mean_v_and_the_clients_start_from_it():
    eng = engine("fedadamw", clients_per_round=3, local_steps=2, eta=0.05)
    sample = sample_of(eng)
    eng.step()
    st, rows = eng.block.state, sample(1)
    v_bar = st["fedadamw.v"][0].clone()
    np.testing.assert_allclose(v_bar, st["fedadamw.v"][rows].mean(0), atol=1e-15, rtol=0)
    assert float(v_bar.min()) > 0
    delta = st["fedadamw.delta"][0] * 0.05  # Δ̄ η is the model change
    np.testing.assert_allclose(delta, eng.nodes[0].x - torch.from_numpy(X0), atol=1e-15, rtol=0)
    # a client's v starts at v̄: with one local step, v = β2 v̄ + (1 − β2) g², g at the model
    one = engine("fedadamw", clients_per_round=3, local_steps=1, eta=0.05, clip=None)
    one.step()
    x1, v1 = one.nodes[0].x.clone(), one.block.state["fedadamw.v"][0].clone()
    one.step()
    for i in sample_of(one)(2):
        g = PROBLEM.grad_full(i - 1, x1)
        expect = 0.999 * v1 + 0.001 * g * g
        np.testing.assert_allclose(one.block.state["fedadamw.v"][i], expect, atol=1e-15, rtol=0)


def test_fedadamw_sends_v_up_and_its_state_down():
    eng = engine("fedadamw", clients_per_round=2, local_steps=1, eta=0.05)
    eng.run(5, log_every=5)
    rec = eng.record()
    up, down = 8 * (8 + 8 * 2 * D), 8 * (8 + 8 * 3 * D)  # (Δ, v) up; (x, v̄, Δ̄) down; float64
    assert rec["bits_up_per_client"] == 5 * 2 * up / (N - 1)
    assert rec["bits_down_per_client"] == 5 * 2 * down / (N - 1)


# ---- FedAdam-SSM ----------------------------------------------------------------------------------


@pytest.mark.parametrize("mask", ["shared", "separate"])
@pytest.mark.parametrize("memory", ["ef21", None])
def test_fedadam_ssm_matches_reference(mask, memory):
    common = dict(clients_per_round=3, local_steps=3, eta=0.05, density=0.5)
    eng = engine("fedadam-ssm", mask=mask, uplink_memory=memory, **common)
    ours = server_models(eng, 12)
    assert_close(ours, fedadam_ssm(X0, GRADS, 12, sample_of(eng), shared=mask == "shared",
                                   ef21=memory == "ef21", **ref(common)))


def test_fedadam_ssm_keeping_every_entry_is_the_dense_form():
    common = dict(clients_per_round=3, local_steps=3, eta=0.05)
    runs = [server_models(engine("fedadam-ssm", density=1.0, mask=mask, **common), 10)
            for mask in ("shared", "separate")]
    dense = fedadam_ssm(X0, GRADS, 10, sample_of(engine("fedadam-ssm", **common)),
                        density=1.0, **ref(common))
    for ours in runs:
        assert_close(ours, dense)
    sparse = server_models(engine("fedadam-ssm", density=0.5, **common), 10)
    assert np.abs(sparse[-1] - dense[-1]).max() > 1e-4


def test_fedadam_ssm_one_mask_for_three_updates():
    """The shared mask keeps Δx, Δm, Δv on the top-k set of |Δx|; the server's m and v move
    only there; the index set travels once."""
    eng = engine("fedadam-ssm", clients_per_round=1, local_steps=2, eta=0.05, density=0.5,
                 uplink_memory=None)
    eng.step()
    (i,) = sample_of(eng)(1)
    st, x = eng.block.state, eng.nodes[0].x
    kept = top_set(np.abs(eng.nodes[i].x.numpy() - X0), D // 2)
    for moved in (x.numpy() - X0, st["ssm.m"][0].numpy(), st["ssm.v"][0].numpy()):
        assert set(np.flatnonzero(moved)) == set(kept)
    k = D // 2
    bits = {}
    for mask in ("shared", "separate"):
        e = engine("fedadam-ssm", clients_per_round=2, local_steps=1, eta=0.05, density=0.5,
                   mask=mask)
        e.run(3, log_every=3)
        bits[mask] = e.record()["bits_up_per_client"] * (N - 1) / (3 * 2)
    assert bits["shared"] == 8 * (8 + 3 * k * 8 + 4 * k)  # 3k float64 values, k indices
    assert bits["separate"] == 8 * (8 + 3 * k * 8 + 3 * 4 * k)  # three index sets


# ---- resume, refusals -----------------------------------------------------------------------------


@pytest.mark.parametrize("name,hp", [
    ("fedadamw", dict(clip=1.0, sampling="replacement", availability=0.8)),
    ("fedadam-ssm", dict(density=0.5, downlink_compressor="qsgd:4bit")),
])
def test_resume_equals_uninterrupted_run(name, hp):
    hp = dict(clients_per_round=3, local_steps=2, eta=0.05) | hp
    whole = engine(name, **hp)
    whole.run(10, log_every=10)
    first = engine(name, **hp)
    first.run(4, log_every=4)
    buf = io.BytesIO()
    torch.save({"nodes": first.node_state_dicts(), "run": first.run_state_dict()}, buf)
    buf.seek(0)
    saved = torch.load(buf, weights_only=True)
    resumed = engine(name, **hp)
    resumed.load_state_dicts(saved["nodes"], saved["run"])
    resumed.run(6, log_every=6)
    for i in range(N):
        assert torch.equal(resumed.nodes[i].x, whole.nodes[i].x), i
    assert not torch.equal(whole.nodes[0].x, first.nodes[0].x)
    assert resumed.record()["bits_up_per_client"] == whole.record()["bits_up_per_client"]


@pytest.mark.parametrize("name,hp,spec,says", [
    ("fedadam-ssm", {}, "topk:0.5", "sparsifies its uplink itself"),
    ("fedadam-ssm", {"mask": "random"}, "none", "mask 'random' is not one of"),
    ("fedadam-ssm", {"density": 0.0}, "none", "density"),
    ("fedadamw", {"v_start": "one"}, "none", "v_start 'one'"),
    ("fedadamw", {"step_count": "never"}, "none", "step_count 'never'"),
    ("fedadamw", {"gamma": -1.0}, "none", "gamma"),
    ("fedadamw", {}, "lowrank:1", "use a stateless one"),
])
def test_bad_input_is_one_clear_error(name, hp, spec, says):
    with pytest.raises(ConfigError, match=says):
        engine(name, spec, **hp)
