"""Benchmarks of our kernels and compressed models against PyTorch anchors, written as JSON."""
