#!/usr/bin/env python3
"""Import cycles among the app.* modules of a checkout, as strongly connected groups.

Usage: scripts/import_cycles.py [--deep] ROOT [PACKAGE-PREFIX ...]
Module level only by default (imports inside `if TYPE_CHECKING:` skipped); --deep also counts imports
inside functions and classes. With prefixes, only groups that touch them are printed."""
import ast, sys
from pathlib import Path

DEEP = sys.argv[1] == "--deep"
if DEEP: sys.argv.pop(1)
root = Path(sys.argv[1])
mods = {}
for f in (root / "app").rglob("*.py"):
    name = ".".join(f.relative_to(root).with_suffix("").parts)
    if name.endswith(".__init__"):
        name = name[: -len(".__init__")]
    mods[name] = f

def top_imports(tree, modname, is_pkg):
    out = set()
    def visit(stmts):
        for n in stmts:
            if isinstance(n, ast.If) and "TYPE_CHECKING" in ast.unparse(n.test):
                visit(n.orelse); continue
            if DEEP and isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                visit(n.body); continue
            if isinstance(n, (ast.If, ast.Try, ast.With, ast.For, ast.While)) and (DEEP or not isinstance(n, (ast.For, ast.While))):
                visit(getattr(n, "body", [])); visit(getattr(n, "orelse", [])); visit(getattr(n, "finalbody", []))
                for h in getattr(n, "handlers", []): visit(h.body)
                continue
            if isinstance(n, ast.Import):
                for a in n.names: out.add(a.name)
            elif isinstance(n, ast.ImportFrom):
                base = n.module or ""
                if n.level:
                    parts = modname.split(".")
                    if not is_pkg: parts = parts[:-1]
                    parts = parts[: len(parts) - (n.level - 1)]
                    base = ".".join(parts + ([base] if base else []))
                out.add(base)
                for a in n.names:
                    out.add(f"{base}.{a.name}")
    visit(tree.body)
    return out

graph = {}
for m, f in mods.items():
    deps = set()
    for imp in top_imports(ast.parse(f.read_text()), m, f.name == "__init__.py"):
        while imp and imp not in mods:
            imp = imp.rpartition(".")[0]
        if imp and imp != m:
            deps.add(imp)
        # importing a.b.c runs a and a.b too
        p = imp.rpartition(".")[0] if imp else ""
        while p:
            if p in mods and p != m and not m.startswith(p + "."): deps.add(p)
            p = p.rpartition(".")[0]
    graph[m] = deps

# strongly connected components (Tarjan)
index, low, stack, on, sccs, i = {}, {}, [], set(), [], [0]
sys.setrecursionlimit(10000)
def strong(v):
    index[v] = low[v] = i[0]; i[0] += 1; stack.append(v); on.add(v)
    for w in graph[v]:
        if w not in index: strong(w); low[v] = min(low[v], low[w])
        elif w in on: low[v] = min(low[v], index[w])
    if low[v] == index[v]:
        comp = []
        while True:
            w = stack.pop(); on.discard(w); comp.append(w)
            if w == v: break
        if len(comp) > 1: sccs.append(sorted(comp))
for v in graph:
    if v not in index: strong(v)
only = sys.argv[2:] 
for c in sorted(sccs):
    if not only or any(m.startswith(o) for m in c for o in only):
        print(len(c), c)
print("cycles (strongly connected groups):", len([c for c in sccs if not only or any(m.startswith(o) for m in c for o in only)]))
