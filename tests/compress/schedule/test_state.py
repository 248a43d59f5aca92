"""Tests for compress/schedule/state.py: the checks of a saved schedule state name the key, the saved value
and this schedule's; states written before settings and layers were recorded are not checked on them."""
import pytest

from compress.schedule.state import (
    check_mapping,
    check_saved_layer_names,
    check_saved_layers,
    check_saved_settings,
    check_saved_step,
)


def test_a_changed_setting_names_both_values():
    with pytest.raises(ValueError, match=r"Where: the saved state was made with sparsity=0\.5, this schedule has "
                                         r"sparsity=0\.7; a resumed run keeps its settings: resume with sparsity=0\.5"):
        check_saved_settings("Where", {"score": "l2", "sparsity": 0.7}, {"score": "l2", "sparsity": 0.5})


def test_settings_not_recorded_are_not_checked():
    check_saved_settings("Where", {"sparsity": 0.7, "added_later": 3}, {"sparsity": 0.7})
    check_saved_settings("Where", {"sparsity": 0.7}, None)
    with pytest.raises(ValueError, match="saved settings: expected the mapping state_dict\\(\\) returns, got list"):
        check_saved_settings("Where", {"sparsity": 0.7}, [0.7])


def test_other_layer_names_list_what_differs():
    ours = {"up": {"sparsity": 0.5}, "down": {"sparsity": 0.5}}
    saved = {"fc1": {"sparsity": 0.5}, "down": {"sparsity": 0.5}}
    with pytest.raises(ValueError, match=r"expected the state of this model's layers \['down', 'up'\], got the state "
                                         r"of layers \['down', 'fc1'\] \(only in the state: \['fc1'\]; only in this "
                                         r"model: \['up'\]\)"):
        check_saved_layers("Where", ours, saved)


def test_a_long_list_of_layer_names_is_shortened():
    with pytest.raises(ValueError, match=r"\['a0', 'a1', 'a2', 'a3'\] and 6 more"):
        check_saved_layer_names("Where", {f"a{i}" for i in range(10)}, set())


def test_a_changed_layer_config_names_the_layer_and_the_key():
    ours = {"up": {"type": "BlockSparseConfig", "sparsity": 0.7, "block": 32}}
    saved = {"up": {"type": "BlockSparseConfig", "sparsity": 0.5, "block": 32}}
    with pytest.raises(ValueError, match=r"layer 'up': saved with sparsity=0\.5, this schedule has sparsity=0\.7"):
        check_saved_layers("Where", ours, saved)
    with pytest.raises(ValueError, match=r"layer 'up': saved with type='Mystery', this schedule has "
                                         r"type='BlockSparseConfig'"):
        check_saved_layers("Where", ours, {"up": {"type": "Mystery"}})
    check_saved_layers("Where", ours, {"up": {"type": "BlockSparseConfig", "sparsity": 0.7}})  # block at its default
    check_saved_layers("Where", ours, None)  # written before layers were recorded
    check_saved_layers("Where", ours, {"up": dict(ours["up"])})


@pytest.mark.parametrize("value", [-1, 2.0, True, "3"])
def test_a_saved_step_must_be_a_non_negative_int(value):
    with pytest.raises(ValueError, match=f"Where: saved global_step: expected a non-negative int, got {value!r}"):
        check_saved_step("Where", "global_step", value)


def test_a_saved_step_may_be_none_where_allowed():
    check_saved_step("Where", "last_pruned_step", None, allow_none=True)
    check_saved_step("Where", "last_pruned_step", 0)
    with pytest.raises(ValueError, match="got None"):
        check_saved_step("Where", "last_pruned_step", None)


def test_a_state_must_be_a_mapping_with_its_keys():
    with pytest.raises(ValueError, match="expected the mapping state_dict\\(\\) returns, got int"):
        check_mapping("Where", 3)
    with pytest.raises(ValueError, match=r"with \['global_step'\], got keys \['step'\]"):
        check_mapping("Where", {"step": 3}, required=("global_step",))
