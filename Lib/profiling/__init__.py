"""Sightglass's profilers, under the names CPython 3.15 gives them (PEP 799).

- profiling.tracing: the deterministic profiler (cProfile's engine, on
  sys.monitoring), with exports for flame-graph viewers.
"""

__all__ = ["tracing"]
