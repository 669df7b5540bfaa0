"The methods of the book, each a chapter, on the plug-in protocol of `methods.base`: every submodule is imported (and so registered) here."
import importlib as _importlib, pkgutil as _pkgutil
from .base import *
for _m in _pkgutil.iter_modules(__path__):
    _mod = _importlib.import_module(f"{__name__}.{_m.name}")
    globals().update({k: getattr(_mod, k) for k in getattr(_mod, "__all__", [])})
del _importlib, _pkgutil, _m, _mod
