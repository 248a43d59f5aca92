"""Tests for compress/configs.py: validation errors list what is allowed; dict round trip."""
import dataclasses

import pytest

from compress.configs import BlockSparseConfig, W4A16Config, W8A8BlockConfig, W8A8Config, W8A16Config, config_from_dict


@pytest.mark.parametrize("config", [W8A8Config(), W8A8Config(activation="static", observer="percentile"),
                                    W4A16Config(group_size=None), W4A16Config(64, learnable_scale=True),
                                    BlockSparseConfig(0.75, score="l2"),
                                    BlockSparseConfig(0.5, score="movement"),
                                    BlockSparseConfig(0.5, score="fisher", tile_rows=4),
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
    (lambda: BlockSparseConfig(tile_rows=3), "(1, 2, 4, 8)"),
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


# ---- what a scheme means, asked of its config ------------------------------------------------------
@pytest.mark.parametrize("config, bits, qmax, weight_scales, activation_scales, observes", [
    (W8A8Config(), 8, 127, "channel", "token", True),
    (W8A8Config(activation="static"), 8, 127, "channel", "tensor", True),
    (W4A16Config(), 4, 7, "group", None, False),
    (W4A16Config(group_size=None), 4, 7, "group", None, False),  # one group of the whole padded row
    (W8A16Config(), 8, 127, "channel", None, False),
    (W8A16Config(group_size=128), 8, 127, "group", None, False),
    (W8A8BlockConfig(), 8, 127, "block", "block", False),
    (BlockSparseConfig(), None, None, None, None, False),
])
def test_each_config_says_its_grid_and_scale_layout(config, bits, qmax, weight_scales, activation_scales, observes):
    assert (config.weight_bits, config.qmax) == (bits, qmax)
    assert config.weight_scales == weight_scales and config.activation_scales == activation_scales
    assert config.observes_activations is observes


def test_qmax_is_the_symmetric_grid_of_the_weight_bits_and_the_math_modules_constant():
    from compress.core import block_quant
    from compress.core.quant import INT4_QMAX, INT8_QMAX

    assert W4A16Config.qmax == INT4_QMAX == 2 ** (W4A16Config.weight_bits - 1) - 1
    assert W8A8Config.qmax == W8A16Config.qmax == INT8_QMAX == 2 ** (W8A16Config.weight_bits - 1) - 1
    assert W8A8BlockConfig.qmax == block_quant.QMAX == 127


@pytest.mark.parametrize("config, static, smoothquant, gptq, needs_calibration", [
    (W8A8Config(), False, False, False, False),
    (W8A8Config(activation="static"), True, False, False, True),
    (W8A8Config(smoothquant_alpha=0.5), False, True, False, True),
    (W8A8Config(algorithm="gptq"), False, False, True, True),
    (W4A16Config(), False, False, False, False),
    (W4A16Config(algorithm="gptq"), False, False, True, True),
    (W8A16Config(128, algorithm="gptq"), False, False, True, True),
    (W8A8BlockConfig(), False, False, False, False),
    (BlockSparseConfig(), False, False, False, False),
    (BlockSparseConfig(algorithm="obs"), False, False, False, True),
    (BlockSparseConfig(score="activation"), False, False, False, True),
    (BlockSparseConfig(score="fisher"), False, False, False, False),  # training gradients, not calibration data
])
def test_each_config_says_what_calibration_it_needs(config, static, smoothquant, gptq, needs_calibration):
    assert (config.static, config.smoothquant, config.gptq) == (static, smoothquant, gptq)
    assert config.needs_calibration is needs_calibration


@pytest.mark.parametrize("config, in_features, padded, group, whole", [
    (W4A16Config(128), 576, 640, 128, False),  # SmolLM2's hidden size: padded to 5 groups
    (W4A16Config(32), 576, 576, 32, True),
    (W4A16Config(None), 100, 104, 104, True),  # per channel: K to a multiple of 8, one group of it
    (W8A16Config(None), 100, 104, 104, True),
    (W8A16Config(128), 200, 256, 128, False),
])
def test_grouped_configs_pad_k_to_the_group_size_and_to_8(config, in_features, padded, group, whole):
    assert config.padding(in_features) == (padded, group)
    assert config.padded_in_features(in_features) == padded
    assert config.whole_groups(in_features) is whole


@pytest.mark.parametrize("config", [W8A8Config(), W8A8BlockConfig(), BlockSparseConfig()])
def test_configs_without_groups_pad_nothing(config):
    assert config.padded_in_features(100) == 100 and config.whole_groups(100)


def test_layer_shape_warnings_name_the_padding_or_the_untiled_blocks():
    assert W4A16Config(128).layer_shape_warning("fc", 64, 32) == (
        "W4A16 group_size=128 does not divide in_features=64 of layer 'fc': K is padded with zero channels to "
        "128 (100% more int4 weights there)")
    assert W8A16Config(128).layer_shape_warning("fc", 576, 32) == (
        "W8A16 group_size=128 does not divide in_features=576 of layer 'fc': K is padded with zero channels to "
        "640 (11% more int8 weights there)")
    assert BlockSparseConfig().layer_shape_warning("attn", 48, 144) == (
        "layer 'attn' (144x48) is not a multiple of 32 blocks; it will export dense")
    for config in (W4A16Config(64), W4A16Config(None), W8A16Config(), W8A8Config(), W8A8BlockConfig(),
                   BlockSparseConfig()):
        assert config.layer_shape_warning("fc", 128, 96) is None
    assert BlockSparseConfig().tiles(96, 128) and not BlockSparseConfig().tiles(96, 48)


def test_each_config_names_the_module_it_exports_to():
    from compress.nn.inference import (BSRLinear, BSRW4A16Linear, BSRW8A8Linear, W4A16Linear, W8A8BlockLinear,
                                       W8A8Linear, W8A16Linear)

    assert W8A8Config(activation="static").inference_module is W8A8Linear
    assert W4A16Config(None).inference_module is W4A16Linear
    assert W8A16Config(128).inference_module is W8A16Linear
    assert W8A8BlockConfig().inference_module is W8A8BlockLinear
    assert BlockSparseConfig().inference_module is BSRLinear
    assert W8A8Config().block_sparse_module is BSRW8A8Linear  # stores the kept int8 blocks only
    assert W4A16Config(32).block_sparse_module is BSRW4A16Linear  # ... the kept int4 blocks only
    for config in (W8A16Config(), W8A8BlockConfig(), BlockSparseConfig()):
        assert config.block_sparse_module is None  # pruned blocks stay zeros in the int weight


def test_a_config_class_with_no_registered_module_says_so():
    @dataclasses.dataclass(frozen=True)
    class Unregistered(W8A8Config):
        pass

    with pytest.raises(LookupError, match="Unregistered: no inference module registered"):
        Unregistered().inference_module
