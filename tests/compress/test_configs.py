"""Tests for compress/configs.py: validation errors list what is allowed; dict round trip."""
import dataclasses

import pytest

from compress.configs import BlockSparseConfig, W4A16Config, W8A8Config, config_from_dict


@pytest.mark.parametrize("config", [W8A8Config(), W8A8Config(activation="static", observer="percentile"),
                                    W4A16Config(group_size=None), W4A16Config(64, learnable_scale=True),
                                    BlockSparseConfig(0.75, score="l2"),
                                    BlockSparseConfig(0.5, score="movement")])
def test_dict_round_trip(config):
    assert config_from_dict(config.to_dict()) == config


def test_configs_are_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        W8A8Config().activation = "static"


@pytest.mark.parametrize("make, fragment", [
    (lambda: W8A8Config(activation="per_tensor"), "('dynamic', 'static')"),
    (lambda: W8A8Config(observer="minmax"), "'absmax'"),
    (lambda: W8A8Config(smoothquant_alpha=1.5), "[0, 1]"),
    (lambda: W8A8Config(percentile=0), "(0, 100]"),
    (lambda: W4A16Config(group_size=48), "(32, 64, 128, None)"),
    (lambda: BlockSparseConfig(sparsity=1.0), "[0, 1)"),
    (lambda: BlockSparseConfig(block=16), "(32,)"),
    (lambda: BlockSparseConfig(score="random"), "('magnitude', 'l2', 'movement', 'fisher')"),
])
def test_bad_values_list_what_is_allowed(make, fragment):
    with pytest.raises(ValueError) as error:
        make()
    assert fragment in str(error.value)


@pytest.mark.parametrize("make", [lambda: W4A16Config(group_size="128"), lambda: BlockSparseConfig(sparsity="0.5"),
                                  lambda: W8A8Config(learnable_scale=1), lambda: BlockSparseConfig(block=True)])
def test_bad_types_raise_type_error(make):
    with pytest.raises(TypeError):
        make()


def test_config_from_dict_rejects_unknown_type():
    with pytest.raises(ValueError, match="W8A8Config"):
        config_from_dict({"type": "FP8Config"})


def test_group_size_for_per_channel():
    assert W4A16Config(group_size=None).group_size_for(96) == 96
    assert W4A16Config(group_size=32).group_size_for(96) == 32
