"""Benchmarks: ``benchmarks.py`` is the asv suite, ``test_micro.py`` the pytest-benchmark micro suite.

This file must exist: asv imports ``bench`` as a package (it strips PYTHONPATH).
"""
