"""Tests of scripts/bench."""
