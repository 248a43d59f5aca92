"""Benchmarks and the results pages made from their JSON."""
