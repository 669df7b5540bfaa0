"Docments (a comment after each parameter) cover at least 90% of the public parameters of `dml_book`."
import importlib, inspect, pkgutil
from dataclasses import is_dataclass
from fastcore.docments import docments
import dml_book

def public_modules():
    "Every module of `dml_book` (the generated `_modidx` aside)."
    for m in pkgutil.walk_packages(dml_book.__path__, "dml_book."):
        if not m.name.rpartition(".")[2].startswith("_"): yield importlib.import_module(m.name)

def _own(obj, mod) -> bool: return getattr(obj, "__module__", None) == mod.__name__

def public_callables(mod):
    "(qualified name, function or class, owning class) for each public function, class and method in `mod.__all__`."
    for name in getattr(mod, "__all__", []):
        obj = getattr(mod, name, None)
        if inspect.isfunction(obj) and _own(obj, mod): yield f"{mod.__name__}.{name}", obj, None
        elif inspect.isclass(obj) and _own(obj, mod):
            if is_dataclass(obj) or "__init__" in vars(obj): yield f"{mod.__name__}.{name}", obj, None
            for k, v in vars(obj).items():
                if isinstance(v, (staticmethod, classmethod)): v = v.__func__
                if not k.startswith("_") and inspect.isfunction(v): yield f"{mod.__name__}.{name}.{k}", v, obj

def _inherited(cls, meth: str, param: str):
    "The docment of `param` on the method of the same name in a base class, if any documents it."
    for base in cls.__mro__[1:]:
        f = vars(base).get(meth)
        if isinstance(f, (staticmethod, classmethod)): f = f.__func__
        if inspect.isfunction(f) and (d := docments(f, returns=False).get(param)): return d

def parameters(f, cls=None) -> dict:
    "Each documentable parameter of `f` (self, cls, *args and **kwargs aside) -> whether a comment documents it."
    skip = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    try: sig = inspect.signature(f)
    except (TypeError, ValueError): return {}
    docs = docments(f, returns=False)
    return {p: bool(docs.get(p) or (cls is not None and _inherited(cls, f.__name__, p)))
            for i, (p, v) in enumerate(sig.parameters.items())
            if v.kind not in skip and not (i == 0 and p in ("self", "cls"))}

def coverage(mods=None) -> tuple:
    "(documented, total, [undocumented 'qualname(param)']) over the public API of `mods`."
    done, missing = 0, []
    for mod in mods or public_modules():
        for qual, f, cls in public_callables(mod):
            for p, ok in parameters(f, cls).items():
                done += ok
                if not ok: missing.append(f"{qual}({p})")
    return done, done + len(missing), missing

def test_parameters_reads_comments_and_skips_self():
    class A:
        def f(self, x: int,  # the x
              y=2, *args, **kw): ...
    class B(A):
        def f(self, x, y=3): ...
    assert parameters(A.f, A) == {"x": True, "y": False}
    assert parameters(B.f, B) == {"x": True, "y": False}   # x inherits A.f's comment

def test_docments_cover_ninety_percent_of_public_parameters():
    done, total, missing = coverage()
    assert total > 500, total   # the API is read
    assert done / total >= 0.90, f"{done}/{total} = {done/total:.1%}; undocumented: " + ", ".join(missing)

if __name__ == "__main__":
    import sys   # python tests/test_docments.py [-v]: the coverage, and with -v every undocumented parameter
    done, total, missing = coverage()
    print(f"{done}/{total} = {done/total:.1%}")
    if "-v" in sys.argv: print("\n".join(missing))
