"""Benchmark and profiling scripts of sgrpo_kernels (not part of the installed package).

Run them as modules from the repository root, e.g. `python -m benchmarks.bench_cpu --help`,
`python -m benchmarks.bench_gpu`, `python -m benchmarks.profile_gpu`; helpers they share live in `benchmarks.common`.
"""
