"""Every caught error is said once (issue 50 item 6; docs/architecture.md "Every caught error said once"):
a broad handler in app/ (`except Exception`, `except BaseException`, a bare `except:`) either re-raises, logs to
the operator's log, or hands the error on as a value someone reads. Parsed with `ast`; nothing runs."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BROAD = frozenset({"Exception", "BaseException"})
LOG_METHODS = frozenset({"exception", "error", "warning", "info", "debug", "log", "critical"})
HANDOFF_CALLS = frozenset({"put", "put_nowait", "append", "set_exception", "fail", "_fail"})
# The one handler that cannot log: inside the logging machinery, logging would recurse. The record passes on
# unchanged and logging's own `Handler.handleError` prints the error when a sink formats it.
SAID_BY_LOGGING = frozenset({("app/backend/oplog/redact.py", "_scrub")})


def _is_broad(h: ast.ExceptHandler) -> bool:
    if h.type is None:
        return True
    names = h.type.elts if isinstance(h.type, ast.Tuple) else [h.type]
    return any(isinstance(n, ast.Name) and n.id in BROAD for n in names)


def _walk(stmts: list[ast.stmt]) -> list[ast.AST]:
    """The handler's nodes, not those of a function, lambda or class defined in it (they run later, if ever)."""
    out: list[ast.AST] = []
    todo: list[ast.AST] = list(stmts)
    while todo:
        n = todo.pop()
        out.append(n)
        if not isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            todo.extend(ast.iter_child_nodes(n))
    return out


def _oplog_loggers(tree: ast.Module) -> set[str]:
    """Module-level names bound to a logger of the operator's log: `oplog.logger(...)` or
    `logging.getLogger("moet_panel...")`."""
    names: set[str] = set()
    for st in tree.body:
        if isinstance(st, ast.Assign) and isinstance(st.value, ast.Call) and isinstance(st.value.func, ast.Attribute):
            f, args = st.value.func, st.value.args
            ours = (isinstance(f.value, ast.Name) and f.value.id == "oplog" and f.attr == "logger") or (
                isinstance(f.value, ast.Name) and f.value.id == "logging" and f.attr == "getLogger" and args
                and isinstance(args[0], ast.Constant) and str(args[0].value).startswith("moet_panel"))
            if ours:
                names.update(t.id for t in st.targets if isinstance(t, ast.Name))
    return names


def _reads(node: ast.AST | None, name: str | None) -> bool:
    return node is not None and name is not None and any(
        isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Load) for n in ast.walk(node))


def verdict(h: ast.ExceptHandler, loggers: set[str], *, cli: bool) -> str:
    """How a broad handler says its error: 'raises', 'logs', 'hands on', 'tells the terminal', or '' (silent)."""
    nodes = _walk(h.body)
    if any(isinstance(n, ast.Raise) for n in nodes):
        return "raises"
    for n in nodes:
        if not isinstance(n, ast.Call):
            continue
        f = n.func
        if isinstance(f, ast.Attribute):
            if isinstance(f.value, ast.Name) and f.value.id == "oplog" and f.attr in ("caught", "decision"):
                return "logs"
            if "caught" in f.attr:  # oplog.Once.caught, the engine's ErrorsOnce and `_caught*`: all end in oplog.caught
                return "logs"
            if f.attr in LOG_METHODS and isinstance(f.value, ast.Name) and f.value.id in loggers:
                return "logs"
            if f.attr in HANDOFF_CALLS and any(_reads(a, h.name) for a in n.args):
                return "hands on"
        if cli and isinstance(f, ast.Name) and f.id == "print" and any(
                k.arg == "file" and ast.unparse(k.value) == "sys.stderr" for k in n.keywords):
            return "tells the terminal"
    for n in nodes:
        if isinstance(n, (ast.Return, ast.Yield, ast.YieldFrom)) and _reads(n.value, h.name):
            return "hands on"
        if isinstance(n, (ast.Assign, ast.AnnAssign, ast.AugAssign)) and _reads(n.value, h.name):
            return "hands on"
    return ""


def silent_handlers(root: Path) -> list[str]:
    out = []
    for f in sorted((root / "app").rglob("*.py")):
        tree = ast.parse(f.read_text())
        loggers = _oplog_loggers(tree)
        rel = f.relative_to(root)
        cli = rel.parts[:2] == ("app", "cli")
        for fn in [tree, *(n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)))]:
            exempt = (rel.as_posix(), getattr(fn, "name", "")) in SAID_BY_LOGGING
            for n in _walk(fn.body):
                if isinstance(n, ast.ExceptHandler) and _is_broad(n) and not exempt and not verdict(n, loggers, cli=cli):
                    out.append(f"{rel}:{n.lineno}")
    return sorted(set(out))


def test_no_caught_error_in_app_is_silent() -> None:
    assert silent_handlers(ROOT) == []


def _one(src: str, *, cli: bool = False) -> str:
    tree = ast.parse(src)
    h = next(n for n in ast.walk(tree) if isinstance(n, ast.ExceptHandler))
    return verdict(h, _oplog_loggers(tree), cli=cli)


def test_the_accepted_patterns_and_the_silent_ones() -> None:
    # each accepted pattern of docs/architecture.md is seen, and each way of swallowing an error is refused
    cases = {
        "try: f()\nexcept Exception: raise": "raises",
        "try: f()\nexcept Exception as e: raise ValueError('x') from e": "raises",
        "try: f()\nexcept Exception as exc: oplog.caught('x', exc, 'doing f')": "logs",
        "try: f()\nexcept Exception as exc: self._caught('doing f', exc)": "logs",
        "log = oplog.logger('ui')\ntry: f()\nexcept Exception: log.exception('f failed')": "logs",
        "log = logging.getLogger('moet_panel.ui')\ntry: f()\nexcept Exception: log.warning('f')": "logs",
        "try: f()\nexcept Exception as exc: return Verdict(False, str(exc))": "hands on",
        "try: f()\nexcept BaseException as exc: reply.error = exc": "hands on",
        "try: f()\nexcept BaseException as exc: q.put(exc)": "hands on",
        "try: f()\nexcept Exception: pass": "",
        "try: f()\nexcept: return None": "",
        "try: f()\nexcept Exception as exc: return None": "",
        "try: f()\nexcept Exception as exc: x = 1": "",
        "log = logging.getLogger(__name__)\ntry: f()\nexcept Exception: log.exception('f')": "",  # not the operator's log
        "try: f()\nexcept Exception as exc:\n    def later(): raise exc": "",  # raised later, if ever
        "try: f()\nexcept Exception as exc: print(exc)": "",
    }
    assert {src: _one(src) for src in cases} == cases
    src = "try: f()\nexcept Exception as exc: print(f'no: {exc}', file=sys.stderr)"
    assert _one(src, cli=True) == "tells the terminal" and _one(src) == ""  # only the CLI's terminal is its operator


def test_the_check_sees_a_violation(tmp_path: Path) -> None:
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "m.py").write_text("def f():\n    try:\n        g()\n    except Exception:\n        return 1\n")
    assert silent_handlers(tmp_path) == ["app/m.py:4"]
