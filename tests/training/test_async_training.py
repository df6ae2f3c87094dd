"""Training with the asynchronous algorithms (docs/asynchronous.md, "Training"): experiments/train.py
on digits in process, a round being a sweep of n activations in virtual time; the flags that
cannot apply refused in one line before any work; the nodes' lr schedules following the sweeps."""

from __future__ import annotations

import pytest
import torch

import topologies
from gossip.training import DecentralizedTrainer, load_dataset, make_model
from tests.helpers.launch import script
from tests.helpers.train_runs import records

STRAGGLER = "compute=exp:1;slow=nodes:0x5"


def _rounds(path):
    return [r for r in records(path) if r["type"] == "round"]


def test_ad_psgd_trains_digits_with_its_optimizer(tmp_path):
    """8 nodes, 5 epochs of 6 sweeps: well above chance (10 classes), logged per epoch."""
    out = tmp_path / "ad.jsonl"
    row = script("train").main(["--algorithm", "ad-psgd", "--nodes", "8", "--epochs", "5",
                                "--out", str(out)])
    assert row["status"] == "ok" and row["test_accuracy"] > 0.8
    recs = _rounds(out)
    config = records(out)[0]
    assert config["rounds_per_epoch"] == 6  # ceil(1437 / (8 · 32)) sweeps
    assert [r["round"] for r in recs] == [0, 6, 12, 18, 24, 30]
    assert [r["epoch"] for r in recs] == [0, 1, 2, 3, 4, 5]
    assert [r["activations"] for r in recs] == [8 * r["round"] for r in recs]
    assert all(r["lr"] == 0.1 for r in recs)  # the nodes' momentum optimizers
    assert recs[-1]["train_loss"] < 0.5 * recs[1]["train_loss"]
    assert row["time_virtual_s"] == recs[-1]["time_virtual_s"] == 30.0  # 1 s per local step


@pytest.mark.parametrize("name", ["gossip-learning", "async-sgp", "async-choco"])
def test_the_other_asynchronous_algorithms_train(name, tmp_path):
    row = script("train").main(["--algorithm", name, "--nodes", "8", "--epochs", "3",
                                "--out", str(tmp_path / "a.jsonl")])
    assert row["status"] == "ok" and row["test_accuracy"] > 0.4


def test_a_straggler_network_logs_virtual_time(tmp_path):
    out = tmp_path / "slow.jsonl"
    script("train").main(["--algorithm", "ad-psgd", "--nodes", "8", "--epochs", "3",
                          "--network", STRAGGLER, "--log-every", "2", "--out", str(out)])
    recs = _rounds(out)
    assert [r["round"] for r in recs] == [0, 2, 4, 6, 8, 10, 12, 14, 16, 18]
    times = [r["time_virtual_s"] for r in recs]
    assert times[0] == 0.0 and all(a < b for a, b in zip(times, times[1:], strict=False))
    assert recs[-1]["test_accuracy"] > 0.5


@pytest.mark.parametrize("flags, named", [
    (["--overlap"], "--overlap"),
    (["--link-latency", "0.01"], "--link-latency"),
])
def test_flags_without_meaning_are_refused_before_any_work(flags, named, tmp_path):
    """One line naming the flag, before the data are read (the data path does not exist)."""
    flags = [str(tmp_path / "ck") if f == "CKPT" else f for f in flags]
    with pytest.raises(SystemExit) as exc:
        script("train").main(["--algorithm", "async-choco", "--data", str(tmp_path / "no.npz"),
                              *flags, "--out", str(tmp_path / "x.jsonl")])
    text = str(exc.value)
    assert text.startswith("error: async-choco is asynchronous (no rounds, virtual time; "
                           f"docs/asynchronous.md) and cannot run with {named} (")
    assert "\n" not in text and not (tmp_path / "ck").exists()


def test_the_lr_schedule_follows_the_sweeps_not_each_nodes_steps():
    """With a straggler the fast nodes step more than once a sweep: their schedulers still read
    the sweep (a step in sweep t at factor(t − 1)), as the algorithm's own eta(t) does."""
    train, _ = load_dataset("digits", seed=0)
    model = make_model("mlp", (64,), 10, hidden=[16])
    seen: dict[int, list[tuple[int, float]]] = {}
    trainer = DecentralizedTrainer(
        model, train, topology=topologies.build("ring", 4), algorithm="ad-psgd",
        optimizer=lambda p: torch.optim.SGD(p, lr=1.0),
        scheduler=lambda opt: torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1 / (1 + s)),
        network=STRAGGLER)
    engine = trainer.engine
    for i, node in engine.nodes.items():
        opt = node.oracle.optimizer
        opt.register_step_post_hook(
            lambda o, *_, i=i: seen.setdefault(i, []).append((engine.block.round,
                                                              o.param_groups[0]["lr"])))
    sweeps = 12
    trainer.fit(rounds=sweeps, log_every=sweeps)
    steps = {i: len(v) for i, v in seen.items()}
    assert steps[0] < sweeps < max(steps.values())  # node 0 is the straggler
    for log in seen.values():
        assert all(lr == 1 / t for t, lr in log)  # factor(t − 1) = 1/t in sweep t


def test_synchronous_runs_pass_the_asynchronous_check():
    from argparse import Namespace

    from gossip.cli import check_asynchronous

    args = Namespace(overlap=True, link_latency=0.0, checkpoint_dir=None, resume=None,
                     checkpoint_every=0)
    check_asynchronous(args, "dpsgd")  # its flags are its own business
    args.overlap = False
    check_asynchronous(args, "ad-psgd")
