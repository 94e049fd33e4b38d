"""Translation rules, one subpackage per op family, one module per concern. Importing this package fills RULES.

Every module of every family here is imported, so a new module or a new family (a folder with an
`__init__.py` saying what it holds) needs no edit here. The families, lowest first: a family imports its
own modules and those of the families above it in this list, never one below.

- core: constants, shapes and data movement, symbolic dims, reduce, dot_general; helpers every family uses.
- control: stablehlo.while / case / if, and the ONNX Loops that rules build in Python.
- elementwise: arithmetic, comparisons, converts, bit ops, special functions, fma, fmod, rng.
- window: reduce_window, select_and_scatter, convolution.
- sort: stablehlo.sort, top_k, approx_top_k.
- indexing: gather, scatter, dynamic_slice.
- complex: every op on complex tensors (held as float pairs), fft.
- linalg: the LAPACK custom calls, triangular_solve, cholesky.
- calls: func.call, custom_call dispatch, host callbacks, sharding annotations.
"""
import importlib
import pkgutil

# walk_packages imports each family's package to find its modules; importing every module fills RULES.
for _module in pkgutil.walk_packages(__path__, f"{__name__}."):
    importlib.import_module(_module.name)
