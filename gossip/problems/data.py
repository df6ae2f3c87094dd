"""Data for the problems: synthetic recipes, a LibSVM reader, and partitioning across nodes.

Everything here is numpy float64 on the CPU; the problem classes move it to their torch device.

* :func:`synthetic` — the heterogeneous recipes of the reference experiments (docs/experiments.md:
  least squares, logistic, sparse truths for L1 problems), one block of samples per node.
* :func:`load_libsvm` — a small reader for ``label idx:val ...`` files (dense result).
* :func:`partition` — the one function that splits a data set's sample indices over nodes:
  ``iid``, ``sorted`` (by label) or ``dirichlet:ALPHA``.
"""

from __future__ import annotations

import gzip
import math
import os
from dataclasses import dataclass

import numpy as np

from gossip.errors import ConfigError
from topologies.registry import did_you_mean

KINDS = ("least-squares", "lasso", "logistic", "l1-logistic")


@dataclass
class SyntheticData:
    """Per-node data of :func:`synthetic`.

    Attributes:
        A: per node, the ``samples_per_node × dim`` features.
        b: per node, targets (regression) or ±1 labels (classification).
        x_true: ``n_nodes × dim``, the ground truth each node's data was generated from.
    """

    A: list[np.ndarray]
    b: list[np.ndarray]
    x_true: np.ndarray


def synthetic(
    kind: str,
    n_nodes: int = 8,
    dim: int = 200,
    samples_per_node: int = 200,
    heterogeneity: float = 1.0,
    seed: int = 0,
    *,
    common: float = 1.0,
    noise: float | None = None,
    density: float = 0.2,
) -> SyntheticData:
    """Heterogeneous synthetic data, one block per node (docs/experiments.md).

    Node ``i`` has its own ground truth ``x_i = common·x_c + heterogeneity·z_i`` with shared
    ``x_c`` and node-specific ``z_i`` (both ``N(0, I)``), and

    * ``least-squares`` / ``lasso``: ``A_i ~ N(0, 1)``, ``b_i = A_i x_i + noise·N(0, 1)``
      (``noise`` defaults to 0.1);
    * ``logistic`` / ``l1-logistic``: rows ``a ~ N(0, I/dim)`` and
      ``b = sign(aᵀx_i + noise·N(0,1))`` (``noise`` defaults to 0.3) — the docs/experiments.md#logistic recipe;
      unit-variance features would make the margins ``~√dim`` and the data nearly separable;
    * ``lasso`` / ``l1-logistic``: ``x_c`` and every ``z_i`` are sparse, each with
      ``round(density·dim)`` non-zeros on its own random support (so a truth has at most
      ``2·density·dim`` non-zeros).

    docs/experiments.md#least-squares draws fully node-specific truths ``x_i ~ N(0, I)``: that is ``common=0,
    heterogeneity=1`` exactly (same for docs/experiments.md#lasso's sparse truths). The default ``common=1,
    heterogeneity=1`` is as heterogeneous in its node-specific part but adds a shared component;
    ``heterogeneity=0`` gives identical truths (homogeneous data up to sampling noise).
    """
    if kind not in KINDS:
        raise ConfigError(f"unknown synthetic kind {kind!r}; choose one of {KINDS}")
    for name, v in (("n_nodes", n_nodes), ("dim", dim), ("samples_per_node", samples_per_node)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ConfigError(f"{name} must be an int >= 1, got {v!r}")
    if not heterogeneity >= 0 or not common >= 0:
        raise ConfigError(
            f"heterogeneity and common must be >= 0, got heterogeneity={heterogeneity}, "
            f"common={common}"
        )
    if not 0 < density <= 1:
        raise ConfigError(f"density must be in (0, 1], got {density}")
    classification = kind in ("logistic", "l1-logistic")
    sparse = kind in ("lasso", "l1-logistic")
    if noise is None:
        noise = 0.3 if classification else 0.1
    rng = np.random.default_rng(seed)
    nnz = max(1, round(density * dim))

    def draw_truth() -> np.ndarray:
        if not sparse:
            return rng.standard_normal(dim)
        v = np.zeros(dim)
        v[rng.choice(dim, size=nnz, replace=False)] = rng.standard_normal(nnz)
        return v

    x_common = draw_truth()
    A, b, truths = [], [], []
    scale = 1.0 / math.sqrt(dim) if classification else 1.0
    for _ in range(n_nodes):
        x_i = common * x_common + heterogeneity * draw_truth()
        A_i = scale * rng.standard_normal((samples_per_node, dim))
        y = A_i @ x_i + noise * rng.standard_normal(samples_per_node)
        if classification:
            y = np.where(y >= 0, 1.0, -1.0)
        A.append(A_i)
        b.append(y)
        truths.append(x_i)
    return SyntheticData(A=A, b=b, x_true=np.stack(truths))


# ---- LibSVM ---------------------------------------------------------------------------------


MAX_DENSE_BYTES = float(16 << 30)
"""The largest dense float64 matrix a LibSVM file may become (the problems are dense)."""


def load_libsvm(
    path: str | os.PathLike,
    n_features: int | None = None,
    binary: bool | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Read a LibSVM/SVMlight file into dense float64 arrays ``(X, y)``.

    Each non-blank line is ``label idx:val idx:val ...`` with 1-based feature indices; text after
    ``#`` is a comment, ``qid:`` tokens are ignored, absent features are 0. ``.gz`` files are read
    transparently.

    Args:
        n_features: number of columns (default: the largest index seen); larger indices are
            errors.
        binary: map two distinct labels to ``-1`` (smaller) / ``+1`` (larger). None (default)
            does so whenever exactly two labels occur; True requires exactly two; False keeps the
            labels as read.

    Raises:
        ConfigError: with ``path:line`` for a bad label, token, index (< 1, duplicate, too
            large) or value (not a finite number), or for a file without samples.
    """
    path = os.fspath(path)
    opener = gzip.open if path.endswith(".gz") else open
    labels: list[float] = []
    rows: list[int] = []
    row_lines: list[int] = []  # the file's line of each sample
    cols: list[int] = []
    vals: list[float] = []

    def fail(lineno: int, msg: str) -> ConfigError:
        return ConfigError(f"{path}:{lineno}: {msg}")

    with opener(path, "rt", encoding="utf-8") as fh:
        for lineno, raw in enumerate(fh, start=1):
            line = raw.split("#", 1)[0].strip()
            if not line:
                continue
            tokens = line.split()
            try:
                label = float(tokens[0])
            except ValueError:
                raise fail(lineno, f"label {tokens[0]!r} is not a number") from None
            if not math.isfinite(label):
                raise fail(lineno, f"label {tokens[0]!r} is not a finite number")
            row = len(labels)
            row_lines.append(lineno)
            seen: set[int] = set()
            for tok in tokens[1:]:
                key, sep, value = tok.partition(":")
                if not sep:
                    raise fail(lineno, f"token {tok!r} is not of the form index:value")
                if key == "qid":
                    continue
                try:
                    idx = int(key)
                except ValueError:
                    raise fail(
                        lineno, f"feature index {key!r} in {tok!r} is not an integer"
                    ) from None
                if idx < 1:
                    raise fail(lineno, f"feature index {idx} in {tok!r}: indices are 1-based")
                if n_features is not None and idx > n_features:
                    raise fail(lineno, f"feature index {idx} exceeds n_features={n_features}")
                if idx in seen:
                    raise fail(lineno, f"feature index {idx} appears twice")
                seen.add(idx)
                try:
                    v = float(value)
                except ValueError:
                    raise fail(lineno, f"value {value!r} in {tok!r} is not a number") from None
                if not math.isfinite(v):
                    raise fail(lineno, f"value {value!r} in {tok!r} is not a finite number")
                rows.append(row)
                cols.append(idx - 1)
                vals.append(v)
            labels.append(label)
    if not labels:
        raise ConfigError(f"{path}: no samples (empty file or only comments)")
    d = n_features if n_features is not None else (max(cols) + 1 if cols else 0)
    dense = 8.0 * len(labels) * d
    if dense > MAX_DENSE_BYTES:
        widest = max(range(len(cols)), key=cols.__getitem__) if cols else 0
        raise ConfigError(
            f"{path}: {len(labels)} samples x {d} features (the largest index, {cols[widest] + 1}, "
            f"on line {row_lines[rows[widest]]}) would be a {dense / 2**30:.3g} GiB dense matrix, "
            f"more than the {MAX_DENSE_BYTES / 2**30:.0f} GiB the problems hold: renumber the "
            "features 1..d (an index is a column of the dense matrix)")
    X = np.zeros((len(labels), d))
    X[np.asarray(rows, dtype=np.int64), np.asarray(cols, dtype=np.int64)] = vals
    y = np.asarray(labels, dtype=np.float64)
    distinct = np.unique(y)
    if binary or (binary is None and distinct.size == 2):
        if distinct.size != 2:
            raise ConfigError(
                f"{path}: binary=True needs exactly two distinct labels, found {distinct.size}: "
                f"{distinct[:10].tolist()}"
            )
        y = np.where(y == distinct[1], 1.0, -1.0)
    return X, y


# ---- partitioning -----------------------------------------------------------------------------


def partition(
    labels: np.ndarray | int,
    n_nodes: int,
    scheme: str = "iid",
    seed: int = 0,
) -> list[np.ndarray]:
    """Split sample indices ``0..N-1`` over nodes; returns one sorted index array per node.

    Args:
        labels: the per-sample labels (``N`` entries); for ``iid`` an int ``N`` is enough.
        scheme: ``"iid"`` — a seeded shuffle cut into ``n_nodes`` parts whose sizes differ by at
            most one; ``"sorted"`` — samples ordered by label (stable) and cut into contiguous parts
            of the same sizes, so each node sees one or two classes (the label-sorted split of
            docs/experiments.md); ``"dirichlet:ALPHA"`` — for every class, proportions over the
            nodes drawn from ``Dirichlet(ALPHA·1)`` (small ALPHA = skewed, large = close to iid);
            labels must be integers; a node left empty receives one sample from the largest node.
        seed: seeds every random choice (same seed, same split).

    Every sample goes to exactly one node and every node gets at least one sample.
    """
    if isinstance(n_nodes, bool) or not isinstance(n_nodes, int) or n_nodes < 1:
        raise ConfigError(f"n_nodes must be an int >= 1, got {n_nodes!r}")
    if isinstance(labels, int | np.integer):
        y = None
        N = int(labels)
    else:
        y = np.asarray(labels).reshape(-1)
        N = y.size
    if N < n_nodes:
        raise ConfigError(f"cannot give each of {n_nodes} nodes a sample: only {N} samples; use at "
                           f"most {N} nodes or more samples")
    rng = np.random.default_rng(seed)
    name, _, arg = scheme.partition(":")
    if name == "iid" and not arg:
        parts = np.array_split(rng.permutation(N), n_nodes)
    elif name == "sorted" and not arg:
        if y is None:
            raise ConfigError("the 'sorted' partition needs the labels, not just a sample count")
        parts = np.array_split(np.argsort(y, kind="stable"), n_nodes)
    elif name == "dirichlet":
        try:
            alpha = float(arg)
        except ValueError:
            raise ConfigError(
                f"bad partition {scheme!r}: write dirichlet:ALPHA with ALPHA > 0, "
                "e.g. dirichlet:0.5"
            ) from None
        if not alpha > 0 or not math.isfinite(alpha):
            raise ConfigError(f"bad partition {scheme!r}: the Dirichlet ALPHA must be > 0")
        if y is None:
            raise ConfigError("the 'dirichlet' partition needs the labels, not just a sample count")
        parts = _dirichlet(y, n_nodes, alpha, rng)
    else:
        hint = did_you_mean(name, ("iid", "sorted", "dirichlet"))
        raise ConfigError(
            f"unknown partition {scheme!r}{hint}; use 'iid', 'sorted' or 'dirichlet:ALPHA'"
        )
    return [np.sort(np.asarray(p, dtype=np.int64)) for p in parts]


def _dirichlet(y: np.ndarray, n_nodes: int, alpha: float, rng: np.random.Generator) -> list:
    y = y.astype(np.float64)
    if not np.all(np.isfinite(y)) or not np.all(y == np.round(y)):
        bad = y[~(np.isfinite(y) & (y == np.round(y)))][0]
        raise ConfigError(
            f"the dirichlet partition splits classes; labels must be integers, got {bad}"
        )
    parts: list[list[int]] = [[] for _ in range(n_nodes)]
    for c in np.unique(y):
        idx = rng.permutation(np.flatnonzero(y == c))
        props = rng.dirichlet(np.full(n_nodes, alpha))
        cuts = np.floor(np.cumsum(props)[:-1] * idx.size).astype(np.int64)
        for node, chunk in enumerate(np.split(idx, cuts)):
            parts[node].extend(chunk.tolist())
    for node in range(n_nodes):
        if not parts[node]:
            donor = max(range(n_nodes), key=lambda k: len(parts[k]))
            parts[node].append(parts[donor].pop())
    return parts
