"""Windowed ops: reduce_window (static, variadic and dynamic), select_and_scatter, and convolution; windows.py
holds what they share (the window attributes, reducers' identities, strided slices, dilation)."""
