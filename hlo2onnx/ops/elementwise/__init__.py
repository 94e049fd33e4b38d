"""Elementwise ops: arithmetic, comparison, convert, clamp (`arithmetic`), integer bit ops and
reduce_precision (`bits`), the functions ONNX lacks (`special`, `special_calls`), fma and float remainder
computed exactly (`fma`, `fmod`), and rng_bit_generator (`rng`, bit arithmetic too)."""
