"""Op rules every model meets (constants, shape and data movement, reduce, dot_general, symbolic dims), and the
helpers the other families build on: `dims` (sizes of symbolic dims), `shape` (reshape_to, transpose_to),
`reduce` (single_reducer), `order` (the float total order)."""
