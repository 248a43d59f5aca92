"""Tests of scripts/, mirroring its tree: the benchmarks, the sweeps and the run scripts."""
