"""Tests for compress/configs.py: validation errors list what is allowed; dict round trip."""
import dataclasses

import pytest

from compress.configs import BlockSparseConfig, W4A16Config, W8A8BlockConfig, W8A8Config, W8A16Config, config_from_dict


@pytest.mark.parametrize("config", [W8A8Config(), W8A8Config(activation="static", observer="percentile"),
                                    W4A16Config(group_size=None), W4A16Config(64, learnable_scale=True),
                                    BlockSparseConfig(0.75, score="l2"),
                                    BlockSparseConfig(0.5, score="movement"),
                                    W4A16Config(128, algorithm="gptq"),
                                    W4A16Config(None, algorithm="gptq", gptq_act_order=True, gptq_block=64),
                                    W8A8Config(algorithm="gptq", gptq_damping=0.1, smoothquant_alpha=0.5),
                                    W8A16Config(), W8A16Config(128, learnable_scale=True),
                                    W8A16Config(algorithm="gptq", gptq_act_order=False),
                                    W8A8BlockConfig(), W8A8BlockConfig(learnable_scale=True)])
def test_dict_round_trip(config):
    assert config_from_dict(config.to_dict()) == config


def test_dicts_saved_before_the_algorithm_field_still_load_as_round_to_nearest():
    """Checkpoint manifests written before GPTQ existed store configs without its keys."""
    old = {"type": "W4A16Config", "group_size": 64, "learnable_scale": False}
    assert config_from_dict(old) == W4A16Config(64) and config_from_dict(old).algorithm == "rtn"
    old = {"type": "W8A8Config", "activation": "static", "observer": "absmax", "percentile": 99.99,
           "smoothquant_alpha": None, "learnable_scale": False}
    assert config_from_dict(old) == W8A8Config(activation="static") and not config_from_dict(old).gptq


def test_configs_are_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        W8A8Config().activation = "static"


@pytest.mark.parametrize("make, fragment", [
    (lambda: W8A8Config(activation="per_tensor"), "('dynamic', 'static')"),
    (lambda: W8A8Config(observer="minmax"), "'absmax'"),
    (lambda: W8A8Config(smoothquant_alpha=1.5), "[0, 1]"),
    (lambda: W8A8Config(percentile=0), "(0, 100]"),
    (lambda: W4A16Config(group_size=48), "(32, 64, 128, None)"),
    (lambda: W8A16Config(group_size=64), "(128, None)"),
    (lambda: W8A16Config(gptq_block=64), "only used with algorithm='gptq'"),
    (lambda: BlockSparseConfig(sparsity=1.0), "[0, 1)"),
    (lambda: BlockSparseConfig(block=16), "(32,)"),
    (lambda: BlockSparseConfig(score="random"), "('magnitude', 'l2', 'movement', 'fisher', 'activation')"),
    (lambda: BlockSparseConfig(algorithm="sparsegpt"), "('score', 'obs')"),
    (lambda: BlockSparseConfig(algorithm="obs", score="l2"), "not used with algorithm='obs'"),
    (lambda: BlockSparseConfig(algorithm="obs", obs_damping=0), "(0, 1]"),
    (lambda: BlockSparseConfig(algorithm="obs", obs_rounds=0), "positive int"),
    (lambda: BlockSparseConfig(obs_rounds=4), "only used with algorithm='obs'"),
    (lambda: W4A16Config(algorithm="awq"), "('rtn', 'gptq')"),
    (lambda: W8A8Config(algorithm="gptq", gptq_damping=0), "(0, 1]"),
    (lambda: W4A16Config(algorithm="gptq", gptq_block=0), "positive int"),
    (lambda: W4A16Config(gptq_act_order=True), "only used with algorithm='gptq'"),
    (lambda: W8A8Config(gptq_damping=0.1), "only used with algorithm='gptq'"),
    (lambda: W8A8BlockConfig(block=64), "(128,)"),
    (lambda: W8A8BlockConfig(algorithm="gptq"), "('rtn',)"),
])
def test_bad_values_list_what_is_allowed(make, fragment):
    with pytest.raises(ValueError) as error:
        make()
    assert fragment in str(error.value)


@pytest.mark.parametrize("make", [lambda: W4A16Config(group_size="128"), lambda: BlockSparseConfig(sparsity="0.5"),
                                  lambda: W8A8Config(learnable_scale=1), lambda: BlockSparseConfig(block=True),
                                  lambda: W4A16Config(algorithm="gptq", gptq_act_order="yes"),
                                  lambda: W8A8Config(algorithm="gptq", gptq_block=128.0),
                                  lambda: W8A16Config(group_size=128.0), lambda: W8A16Config(learnable_scale="no"),
                                  lambda: W8A8BlockConfig(block=128.0), lambda: W8A8BlockConfig(learnable_scale=0)])
def test_bad_types_raise_type_error(make):
    with pytest.raises(TypeError):
        make()


def test_config_from_dict_rejects_unknown_type():
    with pytest.raises(ValueError, match="W8A8Config"):
        config_from_dict({"type": "FP8Config"})


def test_group_size_for_per_channel():
    assert W4A16Config(group_size=None).group_size_for(96) == 96
    assert W4A16Config(group_size=32).group_size_for(96) == 32


def test_block_config_is_a_quantization_config_without_gptq():
    from compress.configs import QUANT_CONFIGS, is_config

    assert W8A8BlockConfig in QUANT_CONFIGS and is_config(W8A8BlockConfig())
    assert W8A8BlockConfig().gptq is False and W8A8BlockConfig().block == 128
