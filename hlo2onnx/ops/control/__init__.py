"""Control flow: stablehlo.while -> ONNX Loop (with its loop analysis), case / if -> If."""
