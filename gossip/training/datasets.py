"""Data sets that need no download: scikit-learn's digits, synthetic classes, files on disk.

Each loader returns ``(train, test)`` map-style data sets whose samples are ``(input, label)``
with an int64 label; the split is stratified and seeded (:func:`gossip.rng.split_seed`),
so every process of an MPI run builds the same sets.

* :func:`digits` — the 1797 8×8 handwritten digits shipped inside scikit-learn (10 classes),
  scaled to [0, 1]; flat (64,) or image-shaped (1, 8, 8).
* :func:`synthetic_classification` — Gaussian classes around random means.
* :func:`load_tensor_file` — ``.npz`` / ``.pt`` files of tensors (``x``, ``y``, or
  ``x_train``, ``y_train``, ``x_test``, ``y_test``).
* :func:`image_folder` — an ImageFolder directory (``root/CLASS/IMAGE``, or ``root/train`` and
  ``root/test`` of those); needs torchvision, which is optional.
* :func:`load_dataset` — one of the above by name or path (what ``train.py --data`` uses).
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset, Subset, TensorDataset

from gossip.errors import ConfigError
from topologies.registry import did_you_mean

BUILTIN = ("digits", "synthetic")


def stratified_split(
    labels: np.ndarray, test_fraction: float, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """Sorted (train, test) index arrays; each class puts ``round(fraction·count)`` into test."""
    if not 0.0 < test_fraction < 1.0:
        raise ConfigError(f"test fraction must be in (0, 1), got {test_fraction}")
    rng = np.random.default_rng(seed)
    train, test = [], []
    for c in np.unique(labels):
        idx = rng.permutation(np.flatnonzero(labels == c))
        k = int(round(test_fraction * idx.size))
        test.append(idx[:k])
        train.append(idx[k:])
    return np.sort(np.concatenate(train)), np.sort(np.concatenate(test))


def _tensor_sets(
    x: np.ndarray | torch.Tensor, y: np.ndarray | torch.Tensor, test_fraction: float, seed: int
) -> tuple[TensorDataset, TensorDataset]:
    xt = torch.as_tensor(np.asarray(x), dtype=torch.float32)
    yt = torch.as_tensor(np.asarray(y)).to(torch.int64).reshape(-1)
    if xt.shape[0] != yt.shape[0]:
        raise ConfigError(f"{xt.shape[0]} inputs but {yt.shape[0]} labels")
    tr, te = stratified_split(yt.numpy(), test_fraction, seed)
    return TensorDataset(xt[tr], yt[tr]), TensorDataset(xt[te], yt[te])


def digits(
    test_fraction: float = 0.2, seed: int = 0, image: bool = False
) -> tuple[TensorDataset, TensorDataset]:
    """scikit-learn's handwritten digits (ships with the package: no download).

    Inputs are the 8×8 gray levels divided by 16 (range [0, 1]), flat ``(64,)`` or, with
    ``image=True``, ``(1, 8, 8)``; labels 0–9. ``seed`` seeds the stratified split.
    """
    data, target = _digits_arrays()
    x = data.astype(np.float32) / 16.0
    if image:
        x = x.reshape(-1, 1, 8, 8)
    return _tensor_sets(x, target, test_fraction, seed)


def _digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """(1797×64 gray levels, labels): the CSV shipped inside scikit-learn, read with numpy.

    Reading the file directly skips importing ``sklearn.datasets`` (about a second per MPI
    rank); ``load_digits`` is the fallback should the file move.
    """
    import importlib.util

    spec = importlib.util.find_spec("sklearn")
    if spec is None:
        raise ConfigError("the digits data set needs scikit-learn: pip install scikit-learn")
    for root in spec.submodule_search_locations or []:
        path = Path(root) / "datasets" / "data" / "digits.csv.gz"
        if path.is_file():
            table = np.loadtxt(path, delimiter=",")
            if table.shape == (1797, 65):
                return table[:, :-1], table[:, -1].astype(np.int64)
    from sklearn.datasets import load_digits  # pragma: no cover - file layout changed

    bunch = load_digits()  # pragma: no cover
    return bunch.data, bunch.target  # pragma: no cover


def synthetic_classification(
    samples: int = 2000,
    features: int = 32,
    classes: int = 10,
    separation: float = 1.0,
    test_fraction: float = 0.2,
    seed: int = 0,
) -> tuple[TensorDataset, TensorDataset]:
    """Gaussian classes: class means ``~ N(0, separation²·I)``, samples ``mean_y + N(0, I)``.

    Labels are balanced (``samples // classes`` each, the remainder to the first classes).
    Larger ``separation`` makes the task easier.
    """
    if samples < classes or features < 1 or classes < 2:
        raise ConfigError(
            f"need samples >= classes >= 2 and features >= 1, got samples={samples}, "
            f"features={features}, classes={classes}"
        )
    rng = np.random.default_rng(seed)
    means = separation * rng.standard_normal((classes, features))
    y = np.arange(samples) % classes
    x = means[y] + rng.standard_normal((samples, features))
    return _tensor_sets(x.astype(np.float32), y, test_fraction, seed + 1)


def load_tensor_file(
    path: str | Path, test_fraction: float = 0.2, seed: int = 0
) -> tuple[TensorDataset, TensorDataset]:
    """Tensors from a ``.npz`` (``numpy.savez``) or ``.pt`` (``torch.save`` of a dict) file.

    Keys: ``x_train, y_train, x_test, y_test`` (used as given) or ``x, y`` (split here,
    stratified, ``test_fraction`` to test). Inputs become float32, labels int64. ``.pt`` files
    are read with ``weights_only=True`` (no pickled code runs).
    """
    path = Path(path)
    if path.suffix == ".npz":
        with np.load(path, allow_pickle=False) as f:
            arrays = {k: f[k] for k in f.files}
    elif path.suffix in (".pt", ".pth"):
        from gossip.checkpoint import pickle_refusal

        try:
            obj = torch.load(path, map_location="cpu", weights_only=True)
        except pickle.UnpicklingError as exc:
            raise ConfigError(f"{path}: {pickle_refusal(exc)}") from None
        if isinstance(obj, (tuple, list)) and len(obj) == 2:
            obj = {"x": obj[0], "y": obj[1]}
        if not isinstance(obj, dict):
            raise ConfigError(f"{path}: expected a dict of tensors, got {type(obj).__name__}")
        arrays = {k: v for k, v in obj.items()}
    else:
        raise ConfigError(f"{path}: unknown data file type '{path.suffix}' (use .npz or .pt)")
    keys = set(arrays)
    if {"x_train", "y_train", "x_test", "y_test"} <= keys:
        def ds(x, y):
            return TensorDataset(torch.as_tensor(np.asarray(x), dtype=torch.float32),
                                 torch.as_tensor(np.asarray(y)).to(torch.int64).reshape(-1))
        return ds(arrays["x_train"], arrays["y_train"]), ds(arrays["x_test"], arrays["y_test"])
    if {"x", "y"} <= keys:
        return _tensor_sets(arrays["x"], arrays["y"], test_fraction, seed)
    raise ConfigError(
        f"{path} holds keys {sorted(keys)}; expected 'x' and 'y', or 'x_train', 'y_train', "
        "'x_test' and 'y_test'"
    )


def image_folder(
    root: str | Path, test_fraction: float = 0.2, seed: int = 0, image_size: int | None = None
) -> tuple[Dataset, Dataset]:
    """An ImageFolder directory read with torchvision (optional dependency).

    ``root/train`` and ``root/test`` (or ``root/val``) are used when present; otherwise the
    classes under ``root`` are split here. Images become tensors in [0, 1], resized to
    ``image_size`` when given.
    """
    try:
        from torchvision import datasets, transforms
    except ImportError:
        raise ConfigError(
            f"{root} is a directory: reading an ImageFolder needs torchvision, which is not "
            "installed (pip install torchvision); or save the images as a .npz file with "
            "arrays x (N×C×H×W floats) and y (N labels) and pass that file"
        ) from None
    steps = ([transforms.Resize((image_size, image_size))] if image_size else []) + [
        transforms.ToTensor()
    ]
    tf = transforms.Compose(steps)
    root = Path(root)
    test_dir = next((root / d for d in ("test", "val") if (root / d).is_dir()), None)
    if (root / "train").is_dir() and test_dir is not None:
        return datasets.ImageFolder(root / "train", tf), datasets.ImageFolder(test_dir, tf)
    full = datasets.ImageFolder(root, tf)
    tr, te = stratified_split(np.asarray(full.targets), test_fraction, seed)
    return Subset(full, tr.tolist()), Subset(full, te.tolist())


def load_dataset(
    name: str, test_fraction: float = 0.2, seed: int = 0, image: bool = False, **synthetic: Any
) -> tuple[Dataset, Dataset]:
    """``digits``, ``synthetic`` or a path (``.npz``/``.pt`` file, ImageFolder directory)."""
    if name == "digits":
        return digits(test_fraction, seed, image=image)
    if name == "synthetic":
        return synthetic_classification(test_fraction=test_fraction, seed=seed, **synthetic)
    path = Path(name)
    if path.is_dir():
        return image_folder(path, test_fraction, seed)
    if path.is_file():
        return load_tensor_file(path, test_fraction, seed)
    raise ConfigError(
        f"--data {name!r}{did_you_mean(name, BUILTIN)}: not a built-in data set "
        f"({', '.join(BUILTIN)}) and no such file or directory; nothing is downloaded at run time"
    )


def input_shape(dataset: Dataset) -> tuple[int, ...]:
    """Shape of one input sample."""
    if isinstance(dataset, TensorDataset):
        return tuple(dataset.tensors[0].shape[1:])
    x = dataset[0][0]
    return tuple(torch.as_tensor(x).shape)


def num_classes(*sets: Dataset) -> int:
    """1 + the largest label over the given data sets."""
    from gossip.training.data import labels_of

    top = max(int(labels_of(s).max()) for s in sets if len(s) > 0)  # type: ignore[arg-type]
    return max(2, top + 1)


def describe(dataset: Dataset) -> str:
    """``N samples, input shape``, for logs."""
    return f"{len(dataset)} samples of shape {input_shape(dataset)}"  # type: ignore[arg-type]

