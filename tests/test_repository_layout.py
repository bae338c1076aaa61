"""The repository around the package is layered too (issue 48): the benchmarks are a
library like the package, so they import nothing from the tests or the scripts, no
module anywhere imports itself back through another, no function in the code folders
runs past 100 lines, and results folders hold results, not the code that made them."""

import ast
from pathlib import Path

import pytest

from .conftest import REPO_ROOT

CODE_FOLDERS = ("fairseq_distattn", "benchmarks", "scripts")
IMPORTING_FOLDERS = (*CODE_FOLDERS, "tests")
LONGEST_FUNCTION = 100  # lines, decorators excluded


def python_files(folder: str):
    return sorted(path for path in (REPO_ROOT / folder).rglob("*.py") if "__pycache__" not in path.parts)


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO_ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(path): path for folder in IMPORTING_FOLDERS for path in python_files(folder)}


def imports_of(module: str, path: Path):
    """Every module of the repository ``module`` imports, anywhere in it (functions
    included: an import inside a function that only hides a cycle is still one)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            # `from . import functional` imports a module
            names = [f"{source}.{a.name}" if f"{source}.{a.name}" in MODULES else source for a in node.names]
        else:
            continue
        for name in names:
            # the nearest module of the repository that the name is or lies in
            while name and name not in MODULES:
                name = name.rpartition(".")[0]
            if name and name != module:
                yield name


def find_cycle(graph):
    """One import cycle of ``graph`` (module -> imported modules) as a list, or None."""
    visiting, done = set(), set()

    def visit(module, trail):
        if module in done:
            return None
        if module in visiting:
            return trail[trail.index(module) :] + [module]
        visiting.add(module)
        for target in sorted(graph.get(module, ())):
            cycle = visit(target, trail + [module])
            if cycle:
                return cycle
        visiting.discard(module)
        done.add(module)
        return None

    for module in sorted(graph):
        cycle = visit(module, [])
        if cycle:
            return cycle
    return None


def import_graph():
    graph = {module: set(imports_of(module, path)) for module, path in MODULES.items()}
    # a package's __init__ runs before any of its modules: importing the package from one of
    # its own modules is not an edge of the design (the package layout test says the same)
    return {module: {t for t in targets if not module.startswith(t + ".")} for module, targets in graph.items()}


def test_no_module_of_the_repository_imports_itself_back():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_cycle_check_sees_a_cycle_hidden_in_functions():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert find_cycle(graph) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


@pytest.mark.parametrize("module", sorted(m for m in MODULES if m.split(".")[0] == "benchmarks"))
def test_the_benchmarks_import_nothing_from_the_tests_or_the_scripts(module):
    for imported in imports_of(module, MODULES[module]):
        assert imported.split(".")[0] not in {"tests", "scripts"}, f"{module} imports {imported}"


def long_functions(path: Path, root: Path = REPO_ROOT):
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            length = node.end_lineno - node.lineno + 1
            if length > LONGEST_FUNCTION:
                yield f"{path.relative_to(root)}:{node.lineno} {node.name} ({length} lines)"


@pytest.mark.parametrize("folder", CODE_FOLDERS)
def test_no_function_runs_past_100_lines(folder):
    found = [line for path in python_files(folder) for line in long_functions(path)]
    assert not found, "split by what each part decides: " + "; ".join(found)


def test_the_length_check_counts_a_long_function(tmp_path):
    for lines, expected in ((LONGEST_FUNCTION, []), (LONGEST_FUNCTION + 1, ["long.py:1 long (101 lines)"])):
        body = "\n".join(f"    x{i} = {i}" for i in range(lines - 1))
        (tmp_path / "long.py").write_text(f"def long():\n{body}\n", encoding="utf-8")
        assert list(long_functions(tmp_path / "long.py", tmp_path)) == expected


def test_results_folders_hold_no_code():
    results = REPO_ROOT / "benchmarks" / "results"
    code = sorted(str(p.relative_to(REPO_ROOT)) for p in results.rglob("*") if p.suffix in {".py", ".sh"})
    assert not code, f"scripts belong beside the harnesses (benchmarks/gpu/, benchmarks/speed/): {code}"
