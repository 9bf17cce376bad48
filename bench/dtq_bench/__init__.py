"""The dtq benchmark suite (``make bench``, ``dtq bench`` from a checkout); not in the wheel.

The entry point is :func:`dtq_bench.suite.main`. This package is kept import-free so that
the peers' virtualenvs (bench/peers, no dtq installed) can import :mod:`dtq_bench.shared`.
"""
