"""The layers of modopt's code: no module imports from a layer above its own, and no import cycle.

Every module under `modopt/` and `integrations/` (installed as `modopt.integrations`) is read
with `ast`, without importing it. Every import of a modopt module counts: at module level,
inside a function, and under `if TYPE_CHECKING:` alike. Importing `modopt.a.b` also runs
`modopt/a/__init__.py` (unless the importer is inside `modopt.a`), so that counts as an import
of `modopt.a` too. A module's layer is the one of its top-level name under `modopt/`: its
folder (`_core`, `transforms`), or the module itself for a file at the root (`fields` for
`fields.py`); `""` is the package root, `modopt/__init__.py`.

docs/development.md ("Layout") says what each layer holds.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# The layers, lowest first. A module may import from its own layer and the layers below.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("_util",),  # pytree and number helpers
    ("_core",),  # the transform protocol: Module, fields, AbstractTransform, specs, extra args, masks
    ("schedules", "fields"),  # schedules: modules whose fields are hyperparameters
    ("_state",),  # how state is stored: moments, 8 bits, compensation, host memory, its size
    (  # functions by family
        "linalg",
        "projections",
        "losses",
        "perturbations",
        "monte_carlo",
        "assignment",
        "microbatching",
        "second_order",
    ),
    ("sharding",),  # state specs on a mesh, per-matrix owners
    ("transforms",),
    ("combinators",),  # transforms built from transforms
    ("optimizers", "trax"),  # named compositions
    ("_step", "tree"),  # `Optimizer` and its step; `modopt.tree`, which sees through an `Optimizer`
    ("experimental",),
    ("contrib",),
    ("", "catalog", "tree_utils", "examples", "integrations"),  # the public surface
)
LEVEL = {name: level for level, names in enumerate(LAYERS) for name in names}


def _modules() -> dict[str, tuple[Path, bool]]:
    """Every module by dotted name: its file, and whether it is a package's `__init__`."""
    found = {}
    for prefix, folder in (("modopt", ROOT / "modopt"), ("modopt.integrations", ROOT / "integrations")):
        for path in sorted(folder.rglob("*.py")):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            is_package = parts[-1] == "__init__"
            name = ".".join([prefix, *(parts[:-1] if is_package else parts)])
            found[name] = (path, is_package)
    return found


def _imports(name: str, path: Path, is_package: bool, modules: dict) -> list[tuple[str, int]]:
    """`(module imported, line)` for each import of a modopt module in the file, wherever it is."""
    package = name if is_package else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1])
                base = ".".join(filter(None, [base, node.module]))
            else:
                base = node.module or ""
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.append((sub if sub in modules else base, node.lineno))
    return [(target, line) for target, line in found if target == "modopt" or target.startswith("modopt.")]


@functools.cache
def _graph() -> tuple[dict, dict[str, list[tuple[str, int]]]]:
    """The modules, and for each the modopt modules it imports (with the line)."""
    modules = _modules()
    graph: dict[str, list[tuple[str, int]]] = {}
    for name, (path, is_package) in modules.items():
        own = name if is_package else name.rpartition(".")[0]
        edges = []
        for target, line in _imports(name, path, is_package, modules):
            parts = target.split(".")
            # the packages whose __init__ the import runs: not the root, not the importer's own
            for stop in range(2, len(parts)):
                package = ".".join(parts[:stop])
                if package in modules and not (own == package or own.startswith(package + ".")):
                    edges.append((package, line))
            edges.append((target, line))
        graph[name] = edges
    return modules, graph


def _layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _where(modules: dict, module: str, line: int) -> str:
    return f"{modules[module][0].relative_to(ROOT)}:{line}"


def test_every_import_names_a_module():
    modules, graph = _graph()
    unknown = [
        f"{_where(modules, name, line)} imports {target}"
        for name, edges in graph.items()
        for target, line in edges
        if target not in modules
    ]
    assert not unknown, "imports of modopt modules that do not exist:\n" + "\n".join(unknown)


def test_every_folder_has_one_layer():
    modules, _ = _graph()
    names = {_layer(module) for module in modules}
    placed = [name for names in LAYERS for name in names]
    assert len(placed) == len(set(placed)), "a name is in two layers"
    assert names - set(placed) == set(), (
        f"not in LAYERS (place each in a layer): {sorted(names - set(placed))}"
    )
    assert set(placed) - names == set(), f"in LAYERS but not in modopt/: {sorted(set(placed) - names)}"


def test_no_import_from_a_higher_layer():
    modules, graph = _graph()
    upward = {}  # (module, line) -> the module it imports there (not the packages on the way)
    for name, edges in graph.items():
        for target, line in edges:
            if (
                _layer(name) in LEVEL
                and _layer(target) in LEVEL
                and LEVEL[_layer(target)] > LEVEL[_layer(name)]
            ):
                upward[name, line] = max(upward.get((name, line), ""), target, key=len)
    upward = [
        f"{_where(modules, name, line)}: {name} ({_layer(name)!r}) imports {target} ({_layer(target)!r})"
        for (name, line), target in upward.items()
    ]
    assert not upward, "imports from a higher layer:\n" + "\n".join(upward)


def _cycle(graph: dict[str, list[tuple[str, int]]]) -> list[str] | None:
    """One import cycle (its modules, the first repeated at the end), or `None`: a depth-first
    search that meets a module on its own path."""
    state: dict[str, str] = {}  # "open": on the current path; "done": every path from it searched
    path: list[str] = []

    def visit(module: str) -> list[str] | None:
        state[module] = "open"
        path.append(module)
        for target in sorted({t for t, _ in graph[module] if t in graph and t != module}):
            if state.get(target) == "open":
                return path[path.index(target) :] + [target]
            if target not in state and (found := visit(target)):
                return found
        path.pop()
        state[module] = "done"
        return None

    for module in sorted(graph):
        if module not in state and (found := visit(module)):
            return found
    return None


def test_no_import_cycle():
    _, graph = _graph()
    cycle = _cycle(graph)
    assert cycle is None, "an import cycle: " + " -> ".join(cycle)
