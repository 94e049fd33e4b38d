"""Before/after check for changes to the translator's speed: records a SHA-256 of every model it writes.

    python benchmarks/convert_identity.py OUT.json [--compare BEFORE.json] [--quick]

Translates the transformers of bench_convert.py (L = 1, 4, 16; forward and gradient), every case of the
test tables (tests/case_tables.py, in its own x64 mode) and the JAX-MD / JAX-CFD samples' functions where
those libraries are installed; each for ort-cpu optimized, ort-cpu unoptimized (the translator alone) and
core. A model is hashed as its deterministic protobuf serialization, provenance included; a refusal is
recorded as its error's type and message. Run it on the code before a change and after, with the same
venv, and `--compare`: any difference is a change in output.
"""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "samples"))
sys.path.insert(0, str(ROOT / "benchmarks"))

import jax  # noqa: E402
import onnx_ir as ir  # noqa: E402

import hlo2onnx  # noqa: E402

# (target, fuse) pairs each module is translated for.
VARIANTS = (("ort-cpu", True), ("ort-cpu", False), ("core", True))


def model_hash(model: ir.Model) -> str:
    return hashlib.sha256(ir.to_proto(model).SerializeToString(deterministic=True)).hexdigest()


def outcomes(text: str) -> dict[str, str]:
    found = {}
    for target, fuse in VARIANTS:
        key = f"{target}{'' if fuse else '/nofuse'}"
        try:
            found[key] = model_hash(hlo2onnx.translate(hlo2onnx.parse_module(text), target=target, fuse=fuse))
        except Exception as e:  # noqa: BLE001  a refusal is an outcome too, and must not change either
            found[key] = f"{type(e).__name__}: {e}"
    return found


def lowered(fun, args, x64: bool = False) -> str:
    with jax.enable_x64(True) if x64 else contextlib.nullcontext():
        return jax.jit(fun, keep_unused=True).lower(*args).as_text()


def modules(quick: bool):
    """(name, StableHLO text) of every model checked."""
    from bench_convert import transformer

    for layers in (1, 4) if quick else (1, 4, 16):
        forward, grad, args = transformer(layers)
        yield f"transformer forward L={layers}", lowered(forward, args)
        yield f"transformer gradient L={layers}", lowered(grad, args)
    try:
        from bench_samples import cfd_case, fire_case
        with jax.enable_x64(True):
            fun, args = fire_case(n=64)
            yield "jaxmd FIRE step", lowered(fun, args, x64=True)
        fun, args = cfd_case(2, 1)
        yield "jaxcfd rollout", lowered(fun, args)
    except ImportError as e:
        print(f"samples skipped: {e}", file=sys.stderr)
    import case_tables

    names: dict[str, int] = {}
    for i, case in enumerate(case_tables.cases()):
        if quick and i % 10:
            continue
        text = case_tables.lowered_text(case)
        if text is None:
            continue
        name = case.name if not isinstance(case, str) else f"text {hashlib.sha256(case.encode()).hexdigest()[:12]}"
        names[name] = names.get(name, 0) + 1
        yield (name if names[name] == 1 else f"{name} #{names[name]}"), text


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("--compare", help="an earlier OUT.json to compare with")
    parser.add_argument("--quick", action="store_true", help="every tenth case, small transformers")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    record = {"jax": jax.__version__, "models": {}}
    for name, text in modules(args.quick):
        record["models"][name] = {"stablehlo": hashlib.sha256(text.encode()).hexdigest(), **outcomes(text)}
    Path(args.out).write_text(json.dumps(record, indent=1, sort_keys=True))
    print(f"{len(record['models'])} modules in {time.perf_counter() - start:.0f} s -> {args.out}")
    if not args.compare:
        return 0
    before = json.loads(Path(args.compare).read_text())["models"]
    after = record["models"]
    changed = sorted(name for name in before.keys() & after.keys() if before[name] != after[name])
    for name in changed:
        diff = {k: (before[name].get(k), after[name].get(k)) for k in before[name].keys() | after[name].keys()
                if before[name].get(k) != after[name].get(k)}
        print(f"CHANGED {name}: {diff}")
    missing = sorted(before.keys() ^ after.keys())
    if missing:
        print(f"in one run only: {missing}")
    print(f"{len(before.keys() & after.keys())} compared, {len(changed)} changed")
    return 1 if changed or missing else 0


if __name__ == "__main__":
    sys.exit(main())
