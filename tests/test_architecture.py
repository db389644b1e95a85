"""docs/architecture.md's package table against the code: each row's `imports` column names exactly the
lsexp packages that package's modules import (function-level imports included), and every package of
src/lsexp has a row."""

import ast
import re
from pathlib import Path

SRC = Path(__file__).parents[1] / "src" / "lsexp"
DOC = Path(__file__).parents[1] / "docs" / "architecture.md"


def package_of(module: str) -> str:
    """lsexp.<package>, or for a top-level module its own name."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def imports() -> dict:
    """{package: the other lsexp packages its modules import}."""
    found = {}
    for path in SRC.rglob("*.py"):
        rel = path.relative_to(SRC.parent).with_suffix("")
        mine = package_of(".".join(rel.parts))
        if mine == "__init__":
            continue
        seen = found.setdefault(mine, set())
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
                if node.module == "lsexp":  # from lsexp import amp, datasets
                    names = [f"lsexp.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            for name in names:
                if name.startswith("lsexp.") and package_of(name) != mine:
                    seen.add(package_of(name))
    return found


def table() -> dict:
    """{package: the packages its row says it imports}, from the table under '## Packages'."""
    text = DOC.read_text().split("## Packages", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 3 or cells[0] in ("package", "---"):
            continue
        named = re.findall(r"`([\w.]+)`", cells[2])
        for package in re.findall(r"`([\w.]+)`", cells[0]):
            rows[package] = set(named)
    return rows


def test_the_package_table_names_what_each_package_imports():
    documented, actual = table(), imports()
    real = {p: {i for i in deps if i in actual} for p, deps in actual.items()}
    assert set(documented) == set(actual), (set(actual) - set(documented), set(documented) - set(actual))
    wrong = {p: (sorted(documented[p]), sorted(real[p])) for p in actual if documented[p] != real[p]}
    assert wrong == {}, "package: (documented, imported)"
