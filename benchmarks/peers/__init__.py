"""Helpers of ``benchmarks/compare.py``: the peers it runs beside the daemon (a private
redis-server, Celery workers, bubblewrap), the timing loops they share, and the report.

Benchmark code only: nothing here is imported by the product packages.
"""
