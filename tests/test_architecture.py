"""The layering README's "How it is built" states: a package imports only the packages listed
above it (imports inside functions count too), so the tree shows the architecture; and every
source file stays under the size the team agreed on."""

from __future__ import annotations

import ast
import pathlib

REPO = pathlib.Path(__file__).resolve().parent.parent
LAYERS = ("yolo", "inputs", "backends", "sequential", "topology", "settings", "analysis", "wire", "sharedmem",
          "process", "workers", "collector", "supervisor", "sweep", "cluster")
ENTRY_POINTS = {"yolo/__main__.py"}  # python -m yolo: the sequential detector's entry, above all
MAX_LINES = 400


def imported_packages(path: pathlib.Path) -> set[tuple[str, int]]:
    """(our package, line) of every import in ``path``, wherever it stands in the file."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        found.update((name.split(".")[0], node.lineno) for name in names if name.split(".")[0] in LAYERS)
    return found


def test_every_package_imports_only_the_packages_below_it():
    upward = []
    for rank, package in enumerate(LAYERS):
        for path in sorted((REPO / package).rglob("*.py")):
            relative = path.relative_to(REPO).as_posix()
            if relative in ENTRY_POINTS:
                continue
            upward += [f"{relative}:{line} imports {name}" for name, line in imported_packages(path)
                       if LAYERS.index(name) > rank]
    assert not upward, "imports from a package above:\n" + "\n".join(sorted(upward))


def test_the_check_sees_an_upward_import(tmp_path):
    """The checker itself: an import inside a function is found, a relative one is ours anyway."""
    module = tmp_path / "m.py"
    module.write_text("import os\n\ndef f():\n    from supervisor.salvage import x\n    import collector.ledger\n")
    assert imported_packages(module) == {("supervisor", 4), ("collector", 5)}


def test_no_source_file_is_longer_than_the_agreed_size():
    long = [f"{p.relative_to(REPO)}: {n} lines" for p in sorted(REPO.rglob("*.py"))
            if not any(part.startswith(".") or part in ("results", "node_modules") for part in p.relative_to(REPO).parts)
            and (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES]
    assert not long, f"files over {MAX_LINES} lines:\n" + "\n".join(long)


def module_graph() -> dict[str, set[str]]:
    """Every module of the packages -> the modules of ours it imports (anywhere in the file)."""
    modules = {p.relative_to(REPO).with_suffix("").as_posix().replace("/", ".").removesuffix(".__init__"): p
               for package in LAYERS for p in (REPO / package).rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                targets.update(f"{node.module}.{alias.name}" for alias in node.names)
                targets.add(node.module)
        graph[name] = {t for t in targets if t in modules and t != name and not name.startswith(t + ".")}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_modules_import_each_other_in_a_circle():
    assert not cycles(module_graph()), "modules that import each other, directly or around a circle"


def test_the_circle_check_sees_a_circle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
