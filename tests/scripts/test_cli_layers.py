"""The command-line package sits above the library: scripts import it, nothing in it imports back."""

import ast
from pathlib import Path

import gossip

PACKAGE = Path(gossip.__file__).parent
ENTRY_POINTS = {PACKAGE / "cli", PACKAGE / "__main__.py"}


def imported_modules(path: Path) -> set[str]:
    """Every module ``path`` imports, at its top or inside a function (absolute names)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def test_no_library_module_imports_the_cli():
    below = [p for p in PACKAGE.rglob("*.py")
             if not any(p == e or e in p.parents for e in ENTRY_POINTS)]
    assert len(below) > 50  # the library itself, not an empty selection
    offenders = sorted(str(p.relative_to(PACKAGE)) for p in below
                       if any(m == "gossip.cli" or m.startswith("gossip.cli.")
                              for m in imported_modules(p)))
    assert not offenders, f"library modules import gossip.cli: {offenders}"
