"""Ops on complex tensors, which the graph holds as float (real, imag) pairs on a trailing axis (pairs.py).

The translator sends every op that touches a complex type here (registry.COMPLEX_RULES):
- data movement and the ops that act on each part alike (add, reshape, slice, gather, while ...)
  run the ordinary rule on the pair tensors (movement.py);
- arithmetic and functions split the pair into (real, imag) planes of shape S + (1,),
  combine them with XLA's formulas and join them back (arithmetic.py);
- reduce and reduce_window (reduce.py), sort (sort.py), fft (fft.py).
An op with no entry here is refused naming the op ("complex operands are not supported").
"""
