"""Every registered rule is exercised by some test case that compares it with jax.jit."""
from __future__ import annotations

from case_tables import cases, lowered_text, ops_in
from hlo2onnx.registry import COMPLEX_RULES, CUSTOM_CALLS, RULES

# Registered for completeness but never in jax's CPU lowering of a test case, each with the test that
# covers it another way.
ELSEWHERE = {
    **{op: "test_other_producers.py::test_symbolic_shapes (jax.export with a symbolic batch)"
       for op in ("stablehlo.dynamic_broadcast_in_dim", "stablehlo.dynamic_reshape", "stablehlo.get_dimension_size",
                  "custom_call @shape_assertion")},
    **{op: "test_dynamic_export.py (jax.export over symbolic dims, run at three sizes)"
       for op in ("stablehlo.dynamic_iota", "stablehlo.dynamic_gather", "stablehlo.real_dynamic_slice",
                  "stablehlo.dynamic_pad", "stablehlo.dynamic_conv", "stablehlo.composite",
                  "custom_call @stablehlo.dynamic_reduce_window")},
    "custom_call @stablehlo.dynamic_top_k": "test_dynamic_probe.py (lax.top_k with a symbolic k, at three sizes)",
    **{op: "test_host_callbacks.py (results and side effects against jax.jit)"
       for op in ("custom_call @xla_ffi_python_cpu_callback", "stablehlo.after_all")},
    # jax 0.12 lowers jnp.abs of complex itself; 0.10 and 0.11 still emit the op.
    "complex stablehlo.abs": "test_other_producers.py::test_handwritten[abs_c64] (StableHLO text)",
}


def test_every_registered_rule_is_exercised():
    wanted = ({op for op in RULES if op != "stablehlo.custom_call"} | {f"custom_call @{t}" for t in CUSTOM_CALLS}
              | {f"complex {op}" for op in COMPLEX_RULES}) - set(ELSEWHERE)
    covered: set[str] = set()
    for case in cases():
        text = lowered_text(case)
        if text is None:
            continue
        covered |= ops_in(text)
        if wanted <= covered:
            break
    assert not wanted - covered, f"rules no test case exercises: {sorted(wanted - covered)}"
