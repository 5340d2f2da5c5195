"""The modules of the tcpy package import each other without a cycle.

The graph is read from the source, not from a running interpreter: every ``import`` and
``from ... import`` of a ``.py`` file (at module level, inside functions, under
``TYPE_CHECKING``; relative imports resolved) and every ``import``/``cimport`` line of a ``.pyx``
file. ``from P import name`` is an edge to the module ``P.name`` when there is one, else to the
package ``P`` itself (its ``__init__`` re-exports the name). Importing ``P.Q`` also runs ``P``'s
``__init__``, but Python allows that one even while ``P`` is being imported, so parent packages
are no edges.
"""
import ast
import re
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent.parent / "tcpy"  # the source, built or not

_PYX_IMPORT = re.compile(r"^\s*(?:from\s+(\.*[\w.]*)\s+c?import\s+(.+)|c?import\s+(.+))$")


def module_files(package_dir: Path) -> dict[str, Path]:
    """Dotted module name -> source file, for every .py and .pyx under ``package_dir``."""
    modules = {}
    for path in sorted(package_dir.rglob("*")):
        if path.suffix not in (".py", ".pyx") or "__pycache__" in path.parts:
            continue
        parts = (package_dir.name,) + path.relative_to(package_dir).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    return modules


def _imports(path: Path):
    """``(line, module or None for an absolute import, level, names)`` for every import in ``path``."""
    if path.suffix == ".pyx":
        for line_no, line in enumerate(path.read_text().splitlines(), 1):
            m = _PYX_IMPORT.match(line.split("#")[0])
            if not m:
                continue
            if m.group(1) is not None:
                dots = len(m.group(1)) - len(m.group(1).lstrip("."))
                names = [n.split()[0] for n in m.group(2).strip("() ").split(",") if n.strip()]
                yield line_no, m.group(1)[dots:], dots, names
            else:
                for name in m.group(3).split(","):
                    yield line_no, name.split()[0], 0, []
        return
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name, 0, []
        elif isinstance(node, ast.ImportFrom):
            yield node.lineno, node.module or "", node.level, [a.name for a in node.names]


def import_graph(package_dir: Path) -> dict[str, dict[str, str]]:
    """module -> {imported module: "file:line" of the first import} among the package's modules."""
    modules = module_files(package_dir)
    graph: dict[str, dict[str, str]] = {name: {} for name in modules}
    for name, path in modules.items():
        is_package = path.stem == "__init__"
        for line, module, level, names in _imports(path):
            if level:
                base = name.split(".")
                base = base[:len(base) - level + (1 if is_package else 0)]
                module = ".".join(base + ([module] if module else []))
            targets = [f"{module}.{n}" if f"{module}.{n}" in modules else module for n in names] or [module]
            for target in targets:
                while target not in modules and "." in target:  # import a.b.c where c is a name
                    target = target.rsplit(".", 1)[0]
                if target in modules and target != name:
                    graph[name].setdefault(target, f"{path.relative_to(package_dir.parent)}:{line}")
    return graph


def find_cycle(graph: dict[str, dict[str, str]]):
    """One cycle as a list of modules (first == last), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node):
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state:
            found = visit(start)
            if found:
                return found
    return None


def describe(cycle, graph) -> str:
    return "\n".join(f"  {a} -> {b}  ({graph[a][b]})" for a, b in zip(cycle, cycle[1:]))


def test_tcpy_has_no_import_cycle():
    graph = import_graph(PACKAGE_DIR)
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle:\n" + describe(cycle, graph)


def test_the_graph_sees_every_kind_of_import():
    graph = import_graph(PACKAGE_DIR)
    assert "tcpy.ranges" in graph["tcpy.api"]  # from . import binding, ranges
    assert "tcpy.lang" in graph["tcpy.cli"]  # from .lang import parse, inside a function
    assert "tcpy.lang.ast" in graph["tcpy.lang.sema"]  # from . import ast
    assert "tcpy.errors" in graph["tcpy.runtime.launch"]  # a .pyx file
    assert "tcpy.runtime.launch" in graph["tcpy.runtime"]  # a package's lazy __getattr__


def test_a_cycle_through_a_function_level_import_is_found(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from .a import f\n")
    (pkg / "a.py").write_text("from .sub import g\n\ndef f():\n    return g()\n")
    (pkg / "sub" / "__init__.py").write_text("from .b import g\n")
    (pkg / "sub" / "b.py").write_text("def g():\n    from .. import a\n    return a\n")
    graph = import_graph(pkg)
    assert find_cycle(graph) == ["pkg.a", "pkg.sub", "pkg.sub.b", "pkg.a"]
    assert "pkg/sub/b.py:2" in describe(find_cycle(graph), graph)


def test_the_language_layer_imports_neither_numpy_nor_islpy():
    """tcpy/lang stays light: its modules (the TC writer included) import no numeric library."""
    found = [f"{path.name}:{line} imports {module}" for name, path in module_files(PACKAGE_DIR).items()
             if name.startswith("tcpy.lang") for line, module, level, _ in _imports(path)
             if not level and module.split(".")[0] in ("numpy", "islpy")]
    assert found == []
