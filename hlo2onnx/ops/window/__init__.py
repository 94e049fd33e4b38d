"""Windowed ops: reduce_window (static, variadic and dynamic), select_and_scatter, and convolution."""
