"""Sightglass's profilers, under the names CPython 3.15 gives them (PEP 799).

- profiling.tracing: the deterministic profiler (cProfile's engine, on
  sys.monitoring), with exports for flame-graph viewers.
- profiling.sampling: the sampling profiler, a thread in C that samples
  every thread's stack at up to 100 kHz, with memory samples, and exports
  for timeline and flame-graph viewers.
"""

__all__ = ["sampling", "tracing"]
