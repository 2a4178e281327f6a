#!/usr/bin/env python3
"""Import cycles among the app.* modules of a checkout, as strongly connected groups.

Usage: scripts/import_cycles.py [--deep] ROOT [PACKAGE-PREFIX ...]
Module level only by default (imports inside `if TYPE_CHECKING:` skipped); --deep also counts imports
inside functions and classes. With prefixes, only groups that touch them are printed.
tests/test_import_boundaries.py imports `module_files`, `imports_of`, `graph` and `cycles` from here."""

from __future__ import annotations

import ast
import sys
from pathlib import Path


def module_files(root: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every .py under ROOT/app (a package by its own name)."""
    mods = {}
    for f in (root / "app").rglob("*.py"):
        name = ".".join(f.relative_to(root).with_suffix("").parts)
        if name.endswith(".__init__"):
            name = name[: -len(".__init__")]
        mods[name] = f
    return mods


def imports_of(tree: ast.Module, modname: str, is_pkg: bool, deep: bool) -> set[str]:
    """Absolute names a module imports (`from a import b` gives both a and a.b); module level unless `deep`."""
    out: set[str] = set()

    def visit(stmts: list[ast.stmt]) -> None:
        for n in stmts:
            if isinstance(n, ast.If) and "TYPE_CHECKING" in ast.unparse(n.test):
                visit(n.orelse)
                continue
            if deep and isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                visit(n.body)
                continue
            if isinstance(n, (ast.If, ast.Try, ast.With, ast.For, ast.While)) and (
                    deep or not isinstance(n, (ast.For, ast.While))):
                visit(getattr(n, "body", []))
                visit(getattr(n, "orelse", []))
                visit(getattr(n, "finalbody", []))
                for h in getattr(n, "handlers", []):
                    visit(h.body)
                continue
            if isinstance(n, ast.Import):
                for a in n.names:
                    out.add(a.name)
            elif isinstance(n, ast.ImportFrom):
                base = n.module or ""
                if n.level:
                    parts = modname.split(".")
                    if not is_pkg:
                        parts = parts[:-1]
                    parts = parts[: len(parts) - (n.level - 1)]
                    base = ".".join(parts + ([base] if base else []))
                out.add(base)
                for a in n.names:
                    out.add(f"{base}.{a.name}")

    visit(tree.body)
    return out


def graph(root: Path, deep: bool = False) -> dict[str, set[str]]:
    """Module -> the app modules importing it runs (parent packages included, except its own)."""
    mods = module_files(root)
    out: dict[str, set[str]] = {}
    for m, f in mods.items():
        deps = set()
        for imp in imports_of(ast.parse(f.read_text()), m, f.name == "__init__.py", deep):
            while imp and imp not in mods:
                imp = imp.rpartition(".")[0]
            if imp and imp != m:
                deps.add(imp)
            # importing a.b.c runs a and a.b too
            p = imp.rpartition(".")[0] if imp else ""
            while p:
                if p in mods and p != m and not m.startswith(p + "."):
                    deps.add(p)
                p = p.rpartition(".")[0]
        out[m] = deps
    return out


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    sccs: list[list[str]] = []
    counter = [0]
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10000))

    def strong(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in g[v]:
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                sccs.append(sorted(comp))

    for v in g:
        if v not in index:
            strong(v)
    return sorted(sccs)


def main(argv: list[str]) -> int:
    deep = bool(argv) and argv[0] == "--deep"
    if deep:
        argv = argv[1:]
    root, only = Path(argv[0]), argv[1:]
    shown = [c for c in cycles(graph(root, deep)) if not only or any(m.startswith(o) for m in c for o in only)]
    for c in shown:
        print(len(c), c)
    print("cycles (strongly connected groups):", len(shown))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
