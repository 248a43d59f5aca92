"""scripts.bench.host_overhead on the CPU: every module kind is timed on each shape, and the table reads."""
from __future__ import annotations

import torch

from scripts.bench import host_overhead

CPU = torch.device("cpu")


def test_every_module_kind_is_timed_on_each_shape():
    rows = host_overhead.measure(CPU, calls=2, shapes=((64, 64), (64, 96)))
    assert [(row["k"], row["n"]) for row in rows] == [(64, 64), (64, 96)]
    for row in rows:
        assert row["linear_us"] > 0 and set(row["modules"]) == set(host_overhead.MODULES)
        assert all(fig["forward_us"] > 0 and "public_launcher_us" not in fig for fig in row["modules"].values())
    table = host_overhead.format_table(rows)
    assert "| 64x96 | dds50-w8a8 |" in table and table.count("| F.linear |") == 2


def test_the_modules_match_the_float_layer_they_come_from():
    torch.manual_seed(0)
    linear = torch.nn.Linear(64, 96, bias=False)
    x = torch.randn(3, 64)
    for kind in ("w8a8", "w4a16", "w8a16", "w8a8-block"):
        module = host_overhead.MODULES[kind](linear)
        assert torch.nn.functional.cosine_similarity(module(x).flatten(), linear(x).flatten(), dim=0) > 0.99
    assert host_overhead.random_mask(linear).float().mean() == 0.5
