"""Dense linear algebra: the LAPACK custom calls jnp.linalg and jax.scipy.linalg emit on CPU, and
stablehlo.triangular_solve / stablehlo.cholesky, each as ONNX Loops over whole batches (`kit`: what they share)."""
