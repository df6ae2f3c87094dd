"""Run under ``mpiexec -n 4`` by tests/training/test_wrap.py: one node per rank through
gossip.wrap. Writes, into the folder given, each rank's losses and final model of the
algorithms of ``wrap_runs.LAUNCHED``, a run of 8 nodes in blocks of 2, the refusal of a model
that differs on rank 1, and a checkpoint round trip."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import torch
from torch.utils.data import DataLoader

from gossip.errors import ConfigError
from gossip.training import digits
from gossip.wrap import wrap
from tests.helpers import wrap_runs


def main(out: Path) -> None:
    rank = 0
    for name in wrap_runs.LAUNCHED:
        losses, x = wrap_runs.wrap_losses(name, None, 8)
        _, opt = wrap_runs.wrapped(name, None)
        rank = opt.rank
        (out / f"{name}.{rank}.json").write_text(json.dumps({"losses": losses}))
        torch.save(x[0].clone(), out / f"{name}.{rank}.pt")

    losses, x = wrap_runs.wrap_losses("choco", 8, 4)  # a block of 2 nodes per rank
    (out / f"block.{rank}.json").write_text(json.dumps({"losses": losses}))
    torch.save(x.clone(), out / f"block.{rank}.pt")

    model = wrap_runs.model()
    if rank == 1:
        with torch.no_grad():
            model[1].bias[0] += 1e-6
    try:
        wrap(model, torch.optim.SGD(model.parameters(), lr=0.1))
        message = "not refused"
    except ConfigError as exc:
        message = str(exc)
    (out / f"unequal.{rank}.txt").write_text(message)

    straight, _ = wrap_runs.wrap_losses("choco", None, 6)
    _, first = wrap_runs.wrapped("choco", None)
    train, _ = digits()
    streams = [wrap_runs.endless(DataLoader(train, batch_size=wrap_runs.BATCH,
                                            sampler=first.sampler(train)))]
    resumed, _ = wrap_runs.wrap_losses("choco", None, 3, opt=first, streams=streams)
    buf = io.BytesIO()
    torch.save(first.state_dict(), buf)
    buf.seek(0)
    _, second = wrap_runs.wrapped("choco", None)
    second.load_state_dict(torch.load(buf, weights_only=True))
    more, _ = wrap_runs.wrap_losses("choco", None, 3, opt=second, streams=streams)
    (out / f"resume.{rank}.json").write_text(json.dumps({"straight": straight, "resumed": resumed + more}))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
