"""Device facts (compress_kernels/common/device.py): read from the device once, H100 values off CUDA."""
import types

import pytest
import torch

from compress_kernels.common import device


def test_off_cuda_the_facts_are_an_h100s():
    for name in ("cpu", "meta", torch.device("cpu")):
        assert device.sm_count(name) == device.H100_SM_COUNT == 132
        assert device.l2_bytes(name) == device.H100_L2_BYTES == 50 * 2**20
        assert not device.hopper_or_newer(name)
        assert device.dram_bytes_per_s(name) == device.H100_DRAM_BYTES_PER_S and not device.fast_dram(name)


def test_cuda_facts_come_from_the_device_properties_once(monkeypatch):
    calls = []

    def properties(index):
        calls.append(index)
        return types.SimpleNamespace(multi_processor_count=78, L2_cache_size=40 * 2**20, major=8,
                                     memory_clock_rate=1_593_000, memory_bus_width=5120)  # an A100's HBM2e

    monkeypatch.setattr(torch.cuda, "get_device_properties", properties)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    device._properties.cache_clear()
    try:
        assert device.sm_count("cuda:3") == 78 and device.l2_bytes("cuda:3") == 40 * 2**20
        assert not device.hopper_or_newer("cuda:3")
        assert not device.tma_capable("cuda:3")  # compute capability 8: no tensor descriptors
        assert device.dram_bytes_per_s("cuda:3") == 2 * 1_593_000_000 * 640 and not device.fast_dram("cuda:3")
        assert device.sm_count("cuda") == 78  # no index: the current device
        assert calls == [3, 1]  # cached per device
    finally:
        device._properties.cache_clear()


def test_hbm3e_bandwidth_counts_as_fast_dram(monkeypatch):
    def properties(index):  # an H200's: 3.201 GHz memory clock, 6016-bit bus
        return types.SimpleNamespace(multi_processor_count=132, L2_cache_size=60 * 2**20, major=9,
                                     memory_clock_rate=3_201_000, memory_bus_width=6016)

    monkeypatch.setattr(torch.cuda, "get_device_properties", properties)
    device._properties.cache_clear()
    try:
        assert 4.8e12 < device.dram_bytes_per_s("cuda:0") < 4.82e12
        assert device.fast_dram("cuda:0")
        assert 3.35e12 < device.H100_DRAM_BYTES_PER_S < 3.36e12 < device.FAST_DRAM_BYTES_PER_S
    finally:
        device._properties.cache_clear()


def test_off_cuda_descriptors_run_in_the_interpreter():
    assert device.tma_capable("cpu") and device.tma_capable(torch.device("cpu"))


def test_a_descriptor_holds_unit_stride_rows_of_16_aligned_bytes():
    base = torch.zeros(8, 72, dtype=torch.float16)  # rows of 144 bytes
    assert device.tma_describable(base)
    assert device.tma_describable(base[:, :40])  # a view keeps the 144-byte row stride
    assert not device.tma_describable(base[:, 1:])  # a base 2 bytes past an aligned one
    assert not device.tma_describable(torch.zeros(8, 20, dtype=torch.float16))  # rows of 40 bytes
    assert not device.tma_describable(base.T)  # not unit stride along the last dim
    assert device.tma_describable(torch.zeros(4, 32, dtype=torch.int8)) and not device.tma_describable(
        torch.zeros(4, 24, dtype=torch.int8))  # int8 rows: 32 bytes, 24 bytes


@pytest.mark.gpu
def test_gpu_facts_match_torch():
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    assert device.sm_count("cuda") == props.multi_processor_count
    assert device.l2_bytes("cuda") == props.L2_cache_size
    assert device.hopper_or_newer("cuda") == (props.major >= 9)
    assert device.dram_bytes_per_s("cuda") == 2 * props.memory_clock_rate * 1000 * props.memory_bus_width // 8
