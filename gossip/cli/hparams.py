"""Hyper-parameters from flags: ``--hparam KEY=VALUE`` parsed and checked against the
algorithm's defaults, and the federated flags turned into constructor keywords."""

from __future__ import annotations

import argparse
from typing import Any

from gossip.cli.arguments import FEDERATED_FLAGS


def federated_hparams(args: argparse.Namespace, accepted: set[str], name: str) -> dict[str, Any]:
    """The federated flags given, as keywords; one the algorithm does not take is refused."""
    out = {}
    for key in FEDERATED_FLAGS:
        value = getattr(args, key, None)
        if value is None:
            continue
        if key not in accepted:
            raise SystemExit(f"error: --{key.replace('_', '-')} does not apply to {name} (the "
                             "federated methods take it: fedavg, fedprox, fedadam, ...)")
        out[key] = value
    return out


def parse_hparams(items: list[str]) -> dict[str, Any]:
    """``["freeze_step=100", "byzantine=1,5"]`` -> ``{"freeze_step": 100, "byzantine": [1, 5]}``."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or not key.strip():
            raise SystemExit(f"--hparam {item!r}: expected KEY=VALUE")
        out[key.strip().replace("-", "_")] = hparam_value(text.strip())
    return out


def check_hparam_types(name: str, given: dict[str, Any]) -> None:
    """Refuse an ``--hparam`` value of another kind than the algorithm's default for that key
    (text or a list where it takes a number, a number where it takes true/false), with the
    default as the example: the algorithm's own checks then meet only values of its kinds."""
    import inspect

    from gossip.algorithms import algorithm_class

    params = inspect.signature(algorithm_class(name).__init__).parameters
    for key, value in given.items():
        default = params[key].default if key in params else inspect.Parameter.empty
        numeric = isinstance(default, (int, float)) and not isinstance(default, bool)
        if default is None and key in params:  # resolved by the run: its annotation says the kind
            numeric = params[key].annotation in ("float | None", "int | None", "float | int | None")
        if isinstance(default, bool):
            ok, kind = isinstance(value, bool), "true or false"
        elif numeric:
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
            kind = "a number"
        else:
            continue
        if not ok:
            example = (str(default).lower() if isinstance(default, bool)
                       else "0.1" if default is None else f"{default:g}")
            said = "set by the run" if default is None else example
            raise SystemExit(f"error: --hparam {key}={label_value(value)}: {name}'s {key} is "
                             f"{kind} (default {said}); give one, e.g. --hparam {key}={example}")


def hparam_value(text: str) -> Any:
    """``--hparam`` values: int, float, true/false, a comma list of ints, else the string."""
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    if "," in text or text == "":
        try:
            return [int(v) for v in text.split(",") if v.strip()]
        except ValueError:
            pass
    return text


def label_value(value: Any) -> str:
    """An ``--hparam`` value as a label or a message writes it (a list as ``1,5``, a float as ``0.1``)."""
    if isinstance(value, list):
        return ",".join(map(str, value))
    return format(value, "g") if isinstance(value, float) else str(value)
