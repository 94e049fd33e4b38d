"""Ops on complex tensors, which the graph holds as float (real, imag) pairs on a trailing axis, and fft."""
