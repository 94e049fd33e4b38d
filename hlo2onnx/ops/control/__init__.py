"""Control flow: stablehlo.while -> ONNX Loop (control_flow.py, with the analysis that keeps it lean,
loop_analysis.py), case / if -> If, and the ONNX Loops other families build from Python bodies (loops.py)."""
