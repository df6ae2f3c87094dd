"""TOML run files for the experiment scripts: ``--config run.toml``, command-line flags win.

One mechanism for every script. A run file is a flat TOML table whose keys are the script's
flag names, written with ``-`` or ``_`` (``log-every = 5`` or ``log_every = 5``)::

    # run.toml
    nodes = 25
    compressor = ["none", "topk:0.01"]
    gamma = [1.0, 0.05]
    progress = true

    $ python experiments/consensus.py --config run.toml --rounds 500   # --rounds overrides

Every value is checked against the flag it sets before anything runs: an unknown key is an
error naming the key and listing the valid ones; a value of the wrong type is an error naming
the key, the expected type and the value. Switches (``--progress``) take ``true``/``false``;
flags taking several values take a TOML array (a single value is accepted too); flags with a
fixed set of choices must use one of them. A script hooks it in with one call::

    def parse_args(argv=None):
        p = argparse.ArgumentParser(...)
        ...
        from gossip.config import parse_args_with_config
        return parse_args_with_config(p, argv)
"""

from __future__ import annotations

import argparse
import difflib
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn

from gossip.errors import ConfigFileError

CONFIG_FLAG = "--config"
MAX_CONFIG_BYTES = 1 << 20
"""A run or sweep file is a few hundred bytes; anything past 1 MiB is the wrong file."""


def add_config_argument(parser: argparse.ArgumentParser) -> None:
    """Add ``--config FILE`` to ``parser`` (once)."""
    if any(CONFIG_FLAG in a.option_strings for a in parser._actions):
        return
    parser.add_argument(
        CONFIG_FLAG, default=None, metavar="FILE",
        help="TOML run file whose keys are this script's flag names (with - or _); flags given "
             "on the command line override it",
    )


class ParsedArgs(argparse.Namespace):
    """The namespace :func:`parse_args_with_config` returns: also knows each flag's option
    string and the parser's default (read with :func:`flag_defaults`), kept outside ``vars()``
    so the config record, and with it a checkpoint's identity, is unchanged."""

    __slots__ = ("_gossip_flags",)


def flag_defaults(args: argparse.Namespace) -> dict[str, tuple[str, Any]] | None:
    """``{dest: (option string, default)}`` of the parser that made ``args`` (None when it was
    not parsed by :func:`parse_args_with_config`): a refused resume names ``--gamma-dual``, not
    ``gamma_dual``, and says which values are defaults, i.e. flags that were left out."""
    return getattr(args, "_gossip_flags", None)


def parse_args_with_config(
    parser: argparse.ArgumentParser, argv: Sequence[str] | None = None
) -> argparse.Namespace:
    """``parser.parse_args(argv)`` after applying the ``--config`` file's values as defaults.

    Errors in the file stop with ``parser.error`` (usage line, the message, exit status 2), like
    any other bad flag.
    """
    add_config_argument(parser)
    flags = {a.dest: (next((o for o in a.option_strings if o.startswith("--")),
                           a.option_strings[0] if a.option_strings else a.dest), a.default)
             for a in parser._actions if a.default is not argparse.SUPPRESS}  # before the file's
    from gossip.comm.launch import launcher_rank

    if launcher_rank() != 0:  # under mpiexec a bad flag (or --help) is printed by rank 0 only
        parser._print_message = lambda *args, **kwargs: None  # type: ignore[method-assign]
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument(CONFIG_FLAG, default=None)
    known, _ = pre.parse_known_args(argv)
    if known.config is not None:
        try:
            values = config_values(parser, load_toml(known.config), source=known.config)
        except ConfigFileError as exc:
            parser.error(str(exc))
        for action in parser._actions:
            if action.dest in values and action.required:
                action.required = False  # given by the file; the command line may still override
        parser.set_defaults(**values)
    suggest_flags(parser)
    args = parser.parse_args(argv, namespace=ParsedArgs())
    args._gossip_flags = flags
    return args


def suggest_flags(parser: argparse.ArgumentParser) -> None:
    """Make ``parser`` answer a mistyped flag with the closest ones it has
    (``unrecognized arguments: --nodse 4 (did you mean --nodes?)``), and a mistyped choice
    with the closest choice (``invalid choice: 'adamm' (did you mean 'adam'?); choose from
    ...``)."""
    import difflib
    import re

    error = parser.error

    def error_with_suggestions(message: str) -> NoReturn:
        choice = re.match(r"(argument [^:]+: invalid choice: )'([^']*)' \(choose from (.*)\)$",
                          message)
        if choice:
            head, given, listed = choice.groups()
            close = difflib.get_close_matches(given, re.findall(r"'([^']*)'", listed), n=1,
                                              cutoff=0.6)
            if close:
                message = f"{head}'{given}' (did you mean '{close[0]}'?); choose from {listed}"
        prefix = "unrecognized arguments: "
        if message.startswith(prefix):
            known = [o for a in parser._actions for o in a.option_strings if o.startswith("--")]
            hints = []
            for token in message[len(prefix):].split():
                flag = token.split("=", 1)[0]
                if flag.startswith("--"):
                    close = difflib.get_close_matches(flag, known, n=1, cutoff=0.6)
                    if close:
                        hints.append((flag, f"did you mean {close[0]}?"))
            if len(hints) == 1:
                message += f" ({hints[0][1]})"
            elif hints:
                message += " (" + "; ".join(f"{flag}: {hint}" for flag, hint in hints) + ")"
        error(message)

    parser.error = error_with_suggestions  # type: ignore[method-assign]


def user_file(path: str | Path, what: str, max_bytes: int | None = None) -> Path:
    """``path`` after checking that it is an existing regular file of at most ``max_bytes``.

    Directories, devices (``/dev/zero``), pipes and oversized files are refused before a byte
    is read, with a :class:`ConfigFileError` naming ``what`` (e.g. ``"config file"``).
    """
    path = Path(path)
    try:
        info = path.stat()
    except FileNotFoundError:
        raise ConfigFileError(f"{what} {path} does not exist") from None
    except OSError as exc:
        raise ConfigFileError(f"{what} {path} cannot be read: {exc.strerror}") from None
    if not path.is_file():
        kind = "a directory" if path.is_dir() else "not a regular file (a device, pipe or socket)"
        raise ConfigFileError(f"{what} {path} is {kind}; give a file")
    if max_bytes is not None and info.st_size > max_bytes:
        raise ConfigFileError(
            f"{what} {path} is {info.st_size} bytes, more than the {max_bytes} such a file may "
            "have: is it the right file?"
        )
    return path


def load_toml(path: str | Path) -> dict[str, Any]:
    """The table of a TOML file; a missing, special or oversized file or a syntax error names
    the file."""
    path = user_file(path, "config file", MAX_CONFIG_BYTES)
    try:
        with open(path, "rb") as fh:
            data = fh.read(MAX_CONFIG_BYTES + 1)  # bounded even if the file grows meanwhile
    except OSError as exc:
        raise ConfigFileError(f"config file {path} cannot be read: {exc.strerror}") from None
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigFileError(f"config file {path} is larger than {MAX_CONFIG_BYTES} bytes")
    try:
        return tomllib.loads(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ConfigFileError(f"{path}: not valid TOML: not UTF-8 text ({exc.reason})") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigFileError(f"{path}: not valid TOML: {exc}") from None
    except RecursionError:  # arrays or inline tables nested thousands deep
        raise ConfigFileError(f"{path}: arrays or tables nested too deep to read; a run file "
                              "holds flat 'flag = value' lines (arrays of plain values)") from None
    except ValueError as exc:  # an integer past Python's digit limit for text conversion
        raise ConfigFileError(f"{path}: a number too long to read ({_first_line(exc)}); give "
                              "flag values of ordinary size") from None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0].split(";")[0] if text else type(exc).__name__


def valid_keys(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """Every key a run file may use for ``parser`` (underscore form) -> the action it sets."""
    keys: dict[str, argparse.Action] = {}
    for action in _settable(parser):
        keys[action.dest] = action
        for opt in action.option_strings:
            if opt.startswith("--"):
                keys[_norm(opt[2:])] = action
    return keys


def config_values(
    parser: argparse.ArgumentParser, table: Mapping[str, Any], source: str = "config"
) -> dict[str, Any]:
    """Check ``table`` against ``parser``'s flags; returns ``{dest: value}`` ready for defaults.

    Raises:
        ConfigFileError: naming ``source`` and the key, for an unknown key (listing the valid
            ones), a nested table, or a value of the wrong type or outside the flag's choices.
    """
    keys = valid_keys(parser)
    out: dict[str, Any] = {}
    for key, value in table.items():
        action = keys.get(_norm(key))
        if action is None:
            raise ConfigFileError(_unknown(source, key, parser))
        if isinstance(value, dict):
            raise ConfigFileError(
                f"{source}: key '{key}' is a table; a run file is flat: write 'flag = value' "
                "lines at the top level"
            )
        out[action.dest] = _convert(action, key, value, source)
    return out


# -- internals -------------------------------------------------------------------------------


def _norm(key: str) -> str:
    return key.strip().replace("-", "_")


def _settable(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    skip = (argparse._HelpAction, argparse._VersionAction)
    return [
        a for a in parser._actions
        if a.option_strings and not isinstance(a, skip) and CONFIG_FLAG not in a.option_strings
        and not getattr(a, "not_a_setting", False)  # --list
    ]


def _flag_names(parser: argparse.ArgumentParser) -> list[str]:
    names = set()
    for action in _settable(parser):
        longs = [o[2:] for o in action.option_strings if o.startswith("--")]
        names.add(longs[0] if longs else action.dest.replace("_", "-"))
    return sorted(names)


def _unknown(source: str, key: str, parser: argparse.ArgumentParser) -> str:
    names = _flag_names(parser)
    close = difflib.get_close_matches(key.replace("_", "-"), names, n=1)
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    return f"{source}: unknown key '{key}'{hint}; valid keys: {', '.join(names)}"


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a float"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return f"a {type(value).__name__}"


def _expected(action: argparse.Action) -> str:
    t = action.type
    if t is int:
        base = "an integer"
    elif t is float:
        base = "a number"
    elif t is None or t is str:
        base = "a string"
    else:
        base = getattr(t, "__doc__", None) or getattr(t, "__name__", "a value")
        base = base.strip().splitlines()[0] if base else "a value"
    return base


def _wrong(source: str, key: str, expected: str, value: Any) -> ConfigFileError:
    return ConfigFileError(
        f"{source}: key '{key}' expects {expected}, got {value!r} ({_kind(value)})"
    )


def _convert(action: argparse.Action, key: str, value: Any, source: str) -> Any:
    """The value the flag would hold, after checking its type and choices."""
    if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction,
                           argparse.BooleanOptionalAction)):
        if not isinstance(value, bool):
            raise _wrong(source, key, "a boolean (true or false)", value)
        if isinstance(action, (argparse._StoreFalseAction, argparse.BooleanOptionalAction)) \
                and _norm(key) != action.dest:
            return not value  # 'no-foo = true' means the flag --no-foo was given
        return value
    if isinstance(action, argparse._StoreConstAction):
        if not isinstance(value, bool):
            raise _wrong(source, key, "a boolean (true or false)", value)
        return action.const if value else action.default
    if isinstance(action, argparse._CountAction):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise _wrong(source, key, "a non-negative integer", value)
        return value
    many = action.nargs in ("+", "*") or (isinstance(action.nargs, int) and action.nargs > 1) \
        or isinstance(action, argparse._AppendAction)
    if many:
        items = value if isinstance(value, list) else [value]
        if action.nargs == "+" and not items:
            raise _wrong(source, key, f"a non-empty array of {_expected(action)} values", value)
        if isinstance(action.nargs, int) and len(items) != action.nargs:
            raise _wrong(source, key, f"an array of {action.nargs} values", value)
        return [_scalar(action, key, v, source, whole=value) for v in items]
    if isinstance(value, list):
        raise _wrong(source, key, f"{_expected(action)} (one value, not an array)", value)
    return _scalar(action, key, value, source, whole=value)


def _scalar(action: argparse.Action, key: str, value: Any, source: str, whole: Any) -> Any:
    t = action.type
    if isinstance(value, (dict, list)):
        raise _wrong(source, key, f"an array of {_expected(action)} values", whole)
    if t is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise _wrong(source, key, "an integer", whole)
        out: Any = value
    elif t is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise _wrong(source, key, "a number", whole)
        out = float(value)
    elif t is None or t is str:
        if not isinstance(value, str):
            raise _wrong(source, key, "a string", whole)
        out = value
    else:  # a converter such as 'float or auto': it sees the value as text, like argparse does
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            raise _wrong(source, key, _expected(action), whole)
        if getattr(t, "toml_type", None) is int and not isinstance(value, int):
            raise _wrong(source, key, "an integer", whole)  # a range-checked integer flag
        try:
            out = t(str(value))
        except (TypeError, ValueError, argparse.ArgumentTypeError) as exc:
            detail = "" if str(exc).startswith("expected") else f": {exc}"
            raise ConfigFileError(
                f"{source}: key '{key}' expects {_expected(action)}, got {whole!r}{detail}"
            ) from None
    if action.choices is not None and out not in action.choices:
        choices = ", ".join(repr(c) for c in action.choices)
        raise ConfigFileError(
            f"{source}: key '{key}' must be one of {choices}, got {value!r}"
        )
    return out
