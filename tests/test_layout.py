"""The package's layout is its design: each module sits on a floor and imports
only from its own floor or below, never from the repository around it.

    0  functional/ (pure torch math), registry (declarations)
    1  mechanisms/ (one module per mechanism)
    2  spec, trained_settings (configuration from flags; what a model and a checkpoint were trained as)
    3  modules/ (the fairseq layers), patches/ (the changes to fairseq and torch)
    4  models/ (registered models and architectures, flags), criterions/ (registered losses)
    5  tools/ (check, inspection, docs, translation scoring)
    6  entry points: the package's import hook, ``python -m`` forwarders
"""

import ast
from pathlib import Path

import pytest

from .conftest import REPO_ROOT

PACKAGE = "fairseq_distattn"
FLOORS = {
    "functional": 0,
    "registry": 0,
    "mechanisms": 1,
    "spec": 2,
    "trained_settings": 2,
    "modules": 3,
    "patches": 3,
    "models": 4,
    "criterions": 4,
    "tools": 5,
}
ENTRY_POINTS = {PACKAGE, f"{PACKAGE}.check", f"{PACKAGE}.docs", f"{PACKAGE}.inspect"}
TOP = max(FLOORS.values()) + 1
# what lives beside the package in the repository: never imported by it
REPOSITORY_NEIGHBOURS = {path.name.removesuffix(".py") for path in REPO_ROOT.iterdir()} - {PACKAGE}


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO_ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(path): path for path in sorted((REPO_ROOT / PACKAGE).rglob("*.py"))}


def floor(module: str) -> int:
    if module in ENTRY_POINTS:
        return TOP
    return FLOORS[module.split(".")[1]]


def imported_modules(module: str, path: Path):
    """Every module ``module`` imports (anywhere in it, functions included), absolute."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module
            for alias in node.names:  # `from . import functional` imports a module
                yield f"{source}.{alias.name}" if f"{source}.{alias.name}" in MODULES else source


def test_every_module_of_the_package_has_a_floor():
    missing = [module for module in MODULES if module not in ENTRY_POINTS and module.split(".")[1] not in FLOORS]
    assert not missing, f"give these a floor in tests/test_layout.py (and the design a thought): {missing}"


@pytest.mark.parametrize("module", sorted(MODULES))
def test_a_module_imports_nothing_above_its_floor_nor_beside_the_package(module):
    for imported in imported_modules(module, MODULES[module]):
        top = imported.split(".")[0]
        assert top not in REPOSITORY_NEIGHBOURS, f"{module} imports {imported}, which is not part of the package"
        if top == PACKAGE and imported != PACKAGE:
            assert floor(imported) <= floor(module), (
                f"{module} (floor {floor(module)}) imports {imported} (floor {floor(imported)})"
            )


def test_the_package_s_imports_have_no_cycle():
    graph = {
        module: {imported for imported in imported_modules(module, path) if imported in MODULES and imported != module}
        for module, path in MODULES.items()
    }
    # the package's own __init__ runs first for every import: it is not an edge of the design
    graph = {module: targets - {PACKAGE} for module, targets in graph.items()}
    visiting, done = set(), set()

    def visit(module, trail):
        if module in done:
            return
        assert module not in visiting, "import cycle: " + " -> ".join(trail + [module])
        visiting.add(module)
        for target in sorted(graph[module]):
            visit(target, trail + [module])
        visiting.discard(module)
        done.add(module)

    for module in sorted(graph):
        visit(module, [])


def test_the_floor_check_catches_an_arrow_back_up(tmp_path):
    """The check above is not vacuous: an import of a higher floor is one it sees."""
    path = tmp_path / "offender.py"
    path.write_text("from ..models import arguments\nimport benchmarks.common\n", encoding="utf-8")
    imported = list(imported_modules(f"{PACKAGE}.mechanisms.offender", path))
    assert imported == [f"{PACKAGE}.models.arguments", "benchmarks.common"]
    assert floor(imported[0]) > floor(f"{PACKAGE}.mechanisms.offender")
    assert "benchmarks" in REPOSITORY_NEIGHBOURS


def test_the_architecture_page_lists_these_floors():
    """docs/architecture.md is the newcomer's map: its floor table is this file's FLOORS."""
    import re

    page = (REPO_ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    listed = {}
    for number, modules in re.findall(r"^\| (\d) \| ([^|]+) \|", page, flags=re.M):
        for name in re.findall(r"`([a-z_]+)/?`", modules):
            listed[name] = int(number)
    assert listed == FLOORS
