"""stablehlo.sort, the top_k custom calls and approx_top_k: comparators read into keys, keys into a permutation."""
