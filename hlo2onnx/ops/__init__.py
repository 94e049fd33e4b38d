"""Translation rules, one module per op family. Importing this package fills RULES.

Every module in this folder is imported, so a new family needs no edit here.
"""
import importlib
import pkgutil

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")
