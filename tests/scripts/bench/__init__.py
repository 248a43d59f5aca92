"""Tests of scripts/bench/: the benchmarks' plumbing on the CPU, the anchors against the references."""
