"The import graph of `dml_book`, read from the source (module level and inside functions), has no cycle."
import ast
from pathlib import Path
import dml_book

PKG = Path(dml_book.__file__).parent

def module_name(path: Path) -> str:
    parts = path.relative_to(PKG.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)

def imports(path: Path, modules: set, name: str | None = None) -> set:
    "The `dml_book` modules that `path` imports anywhere in its body (lazy imports included)."
    name, found = name or module_name(path), set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import): targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            targets = [base] + [f"{base}.{a.name}" for a in node.names]
        else: continue
        found |= {t for t in targets if t in modules and t != name}
    return found

def import_graph() -> dict:
    files = [p for p in PKG.rglob("*.py") if p.name != "_modidx.py"]
    modules = {module_name(p) for p in files}
    graph = {module_name(p): imports(p, modules) for p in files}
    for m in modules:   # importing a.b runs the package a's __init__ first: a parent is not an edge we draw
        graph[m] = {t for t in graph[m] if not m.startswith(t + ".")}
    return graph

def find_cycle(graph: dict) -> list | None:
    "One cycle of `graph` as a list of nodes, or None (depth-first search)."
    state, stack = {}, []
    def visit(n):
        state[n] = "open"; stack.append(n)
        for m in sorted(graph.get(n, ())):
            if state.get(m) == "open": return stack[stack.index(m):] + [m]
            if m not in state and (c := visit(m)): return c
        state[n] = "done"; stack.pop()
    for n in sorted(graph):
        if n not in state and (c := visit(n)): return c

def test_find_cycle_finds_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None

def test_lazy_imports_are_edges(tmp_path):
    f = tmp_path/"m.py"; f.write_text("def f():\n    from dml_book.train import Trainer\n")
    assert imports(f, {"dml_book.train"}, "dml_book.x") == {"dml_book.train"}

def test_the_package_has_no_import_cycle():
    graph = import_graph()
    assert "dml_book.metrics" in graph["dml_book.reid_metrics"] and "dml_book.train" in graph["dml_book.cli"]   # the graph is read
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)
