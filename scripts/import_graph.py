"""The repository's import graph, read from the source (nothing is imported): every module of the
product (the packages, train.py, sample.py, scripts/) and what it imports of the others, at the
top of the file or inside a function alike. Prints the packages in layers, lowest first, then
any circle between files and any import that runs from a lower package up to a higher one.

    python scripts/import_graph.py          # exit 1 when there is a circle or an upward import

A layer is a package's place in the order of LAYERS: a module may import its own package and
those of lower layers; the entry points (train.py, sample.py, scripts/) may import anything.
"""

from __future__ import annotations

import ast
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Lowest first; a package imports only from its own layer or below (packages of one layer do not
# import each other).
LAYERS = (("storage",), ("parallel",), ("model",), ("run_config",), ("configs",),
          ("checkpoints", "data"), ("planner",), ("training",), ("launch",))
PACKAGES = tuple(p for layer in LAYERS for p in layer)


def modules() -> dict[str, str]:
    """Dotted module name -> file, for the packages, the entry points and scripts/."""
    found = {}
    for top in (*PACKAGES, "scripts"):
        for folder, _, files in os.walk(os.path.join(ROOT, top)):
            for name in files:
                if name.endswith(".py"):
                    path = os.path.join(folder, name)
                    dotted = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
                    found[dotted.removesuffix(".__init__")] = path
    for name in ("train", "sample"):
        found[name] = os.path.join(ROOT, f"{name}.py")
    return found


def imports(path: str, known: dict[str, str]) -> set[str]:
    """The modules of `known` that the file at `path` imports: `from package import name` is
    the submodule package.name where there is one, else the package's __init__."""
    tree = ast.parse(open(path).read(), path)
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            # a submodule by its name; any other name comes from the module's own file
            names = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in known
                     else node.module for a in node.names]
        else:
            continue
        for name in names:
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name:
                out.add(name)
    return out


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports(path, known) - {name} for name, path in known.items()}


def layer(module: str) -> int | None:
    top = module.split(".")[0]
    for i, packages in enumerate(LAYERS):
        if top in packages:
            return i
    return None  # an entry point


def upward(edges: dict[str, set[str]]) -> list[tuple[str, str]]:
    """(importer, imported) where a package imports a higher layer, or another package of its
    own layer, or an entry point."""
    bad = []
    for a, targets in sorted(edges.items()):
        if layer(a) is None:
            continue
        for b in sorted(targets):
            same_package = a.split(".")[0] == b.split(".")[0]
            if not same_package and (layer(b) is None or layer(b) >= layer(a)):
                bad.append((a, b))
    return bad


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm)."""
    index, low, stack, on_stack, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    sys.setrecursionlimit(10_000)
    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def main() -> int:
    edges = graph()
    for i, packages in enumerate(LAYERS):
        counts = [f"{p} ({sum(m.split('.')[0] == p for m in edges)} modules)" for p in packages]
        print(f"layer {i}: {', '.join(counts)}")
    print(f"entry points: train.py, sample.py, scripts/ "
          f"({sum(m.startswith('scripts.') for m in edges)} scripts)")
    found_circles, found_upward = circles(edges), upward(edges)
    for group in found_circles:
        print(f"circle: {' <-> '.join(group)}")
    for a, b in found_upward:
        print(f"upward: {a} imports {b}")
    print(f"{len(found_circles)} circles, {len(found_upward)} upward imports, "
          f"{sum(map(len, edges.values()))} imports between {len(edges)} modules")
    return 1 if found_circles or found_upward else 0


if __name__ == "__main__":
    sys.exit(main())
