"""Tiny models shared by the tests of the callbacks and of the schedule."""
import torch
from torch import nn


class PreNormMLP(nn.Module):
    """x -> LayerNorm -> up -> relu -> down (+ x) -> head; the norm feeds only ``up``."""

    def __init__(self, hidden=64, ffn=128):
        super().__init__()
        self.norm = nn.LayerNorm(hidden)
        self.up = nn.Linear(hidden, ffn)
        self.down = nn.Linear(ffn, hidden)
        self.classifier = nn.Linear(hidden, 4)

    def forward(self, x):
        return self.classifier(x + self.down(torch.relu(self.up(self.norm(x)))))
