"""A user's compressor against the built-in of the same kind: CHOCO-SGD rounds with sign.

``UserSign`` below is sign compression (one scale, the mean |x|, and one bit per entry)
written as docs/extending.md teaches: the batch form, ``_encode_batch`` / ``_decode_batch``
over an [m, d] block of rows, no fast kernel of its own. The built-in ``sign`` sends the same
bytes through its numpy and block kernels. Both run CHOCO-SGD (γ = 0.1) in this process, side
by side and interleaved, on a ring of n nodes with d float32 entries each; the table gives the
best of ``--repeat`` timings of ``--rounds`` rounds, in ms per round, and the ratio::

    python benchmarks/bench_user_codec.py                 # n = 25, d = 2000 and n = 8, d = 1e5
    python benchmarks/bench_user_codec.py --sizes 100x1000
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import ClassVar

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import topologies  # noqa: E402
from gossip.algorithms import make_algorithm  # noqa: E402
from gossip.compress import Codec, pack_bits, register_compressor, unpack_bits  # noqa: E402
from gossip.compress.wire import Sections, numel_of  # noqa: E402
from gossip.engine import Engine  # noqa: E402


class UserSign(Codec):
    """mean|x| · sign(x) per row, in the batch form only (a user's compressor)."""

    kind: ClassVar[int] = 91
    scale_sections: ClassVar[tuple[str, ...]] = ("scale",)

    def _sections(self, shape, dtype) -> Sections:
        return Sections.build(("scale", dtype, 1), ("bits", torch.uint8, -(-numel_of(shape) // 8)))

    def _encode_batch(self, X, rng, v) -> None:
        torch.mean(X.abs(), 1, keepdim=True, out=v["scale"])
        pack_bits(X < 0, v["bits"])

    def _decode_batch(self, v, out) -> None:
        signs = unpack_bits(v["bits"], out.shape[1]).to(out.dtype).mul_(-2.0).add_(1.0)
        torch.mul(signs, v["scale"], out=out)


def engine(spec: str, n: int, d: int) -> Engine:
    """CHOCO-SGD on a ring of ``n`` float32 nodes of ``d`` entries, compressing with ``spec``."""
    return Engine(make_algorithm("choco", gamma=0.1), topologies.build("ring", n),
                  lambda i: torch.randn(d, generator=torch.Generator().manual_seed(i)),
                  compressor=spec, dtype=torch.float32)


def ms_per_round(engines: dict[str, Engine], rounds: int, repeat: int) -> dict[str, float]:
    """Best of ``repeat`` timings of ``rounds`` rounds per engine, interleaved, in ms a round."""
    for e in engines.values():  # warm-up: plans, buffers, caches
        for _ in range(3):
            e.step()
    best = dict.fromkeys(engines, float("inf"))
    for _ in range(repeat):
        for spec, e in engines.items():
            start = time.perf_counter()
            for _ in range(rounds):
                e.step()
            best[spec] = min(best[spec], (time.perf_counter() - start) / rounds * 1e3)
    return best


def size(text: str) -> tuple[int, int]:
    n, _, d = text.partition("x")
    return int(n), int(float(d))


def main(argv: list[str] | None = None) -> str:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", type=size, nargs="+", default=[(25, 2000), (8, 100_000)],
                   metavar="NxD", help="nodes x entries per node, e.g. 25x2000")
    p.add_argument("--rounds", type=int, default=20, help="rounds per timing")
    p.add_argument("--repeat", type=int, default=5, help="timings per run (the best is shown)")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    register_compressor("usersign", UserSign)
    lines = ["| nodes | entries | built-in sign | user's batch-form sign | user / built-in |",
             "|---|---|---|---|---|"]
    for n, d in args.sizes:
        t = ms_per_round({s: engine(s, n, d) for s in ("sign", "usersign")}, args.rounds, args.repeat)
        lines.append(f"| {n} | {d} | {t['sign']:.3f} ms | {t['usersign']:.3f} ms "
                     f"| {t['usersign'] / t['sign']:.2f}× |")
    out = "\n".join(lines)
    print(out)
    return out


if __name__ == "__main__":
    main()
