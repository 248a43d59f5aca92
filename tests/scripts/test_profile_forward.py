"""CPU checks of scripts.profile_forward: kernel names map to the groups its table prints."""
import pytest

from scripts import profile_forward


@pytest.mark.parametrize("name,group", [
    ("_w8a8_matmul_kernel_0d1d2d3d", "ours:_w8a8_matmul_kernel"),
    ("_bsr_gemm_kernel", "ours:_bsr_gemm_kernel"),
    ("sm90_xmma_gemm_f16f16_f16f32_f32_tn_n_tilesize64x64x64", "gemm (cuBLAS)"),
    ("nvjet_hsh_64x32_64x16_2x1_v_bz_TNT", "gemm (cuBLAS)"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl>(int, float)",
     "other:void at::native::vectorized_elementwise_kernel"),
    ("void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::Half, float>(int, float)",
     "other:void at::native::vectorized_layer_norm_kernel"),
])
def test_kernel_group(name, group):
    assert profile_forward.kernel_group(name) == group


def test_refuses_to_run_without_a_gpu(monkeypatch, tmp_path):
    monkeypatch.setattr(profile_forward.torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit):
        profile_forward.main([str(tmp_path)])
