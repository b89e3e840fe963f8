"""Plumbing shared by ``mtemu`` and ``ratrain``: the error base class, crash-safe file writes and
progress lines, array files and host memory. It imports nothing heavier than the standard library
and NumPy (Matplotlib only inside the figure writer), so importing it never loads Numba."""
