"""The package's public names (compress_kernels/__init__.py), and the references importing without Triton."""
import subprocess
import sys

import compress_kernels

REFERENCE_NAMES = ("bsr_matmul_ref", "bsr_to_dense_ref", "bsr_w8a8_matmul_quantized_ref", "bsr_w8a8_matmul_ref",
                   "quantize_per_token", "rms_norm_ref", "safe_scale", "unpack_int4", "w4a16_matmul_ref",
                   "w8a8_matmul_quantized_ref", "w8a8_matmul_ref", "dequantize_int8", "w8a16_matmul_ref",
                   "W8A16_GROUP_SIZE", "BSR_BLOCK", "SCALE_BLOCK", "quantize_act_blocks_ref", "dequantize_act_blocks",
                   "quantize_weight_blocks_ref", "dequantize_weight_blocks", "w8a8_block_matmul_ref",
                   "w8a8_block_matmul_quantized_ref", "gelu_int8_blocks_ref", "bsr_w4a16_matmul_ref",
                   "unpack_int4_blocks", "dequantize_int4_blocks")


def test_public_names():
    for name in compress_kernels.__all__:
        assert getattr(compress_kernels, name) is not None, name
    for name in ("w8a8_matmul", "w8a8_matmul_quantized", "w4a16_matmul", "w8a16_matmul", "bind_w8a16_matmul",
                 "bsr_matmul", "bsr_matmul_parts", "bsr_w8a8_matmul_parts", "bsr_w8a8_matmul_quantized",
                 "layer_norm_quantize", "rms_norm_quantize", "gelu_quantize", "interpreting", "w8a8_block_matmul",
                 "bind_w8a8_block_matmul", "bind_w8a8_block_matmul_int8", "bind_w8a8_block_matmul_quantized",
                 "quantize_act_blocks", "quantize_weight_blocks", "gelu_int8_blocks", "bsr_w4a16_matmul",
                 "bind_bsr_w4a16_matmul"):
        assert callable(getattr(compress_kernels, name)), name
    assert compress_kernels.TRITON_AVAILABLE and compress_kernels.NORM_QUANT_MAX_ROW == 16384
    for name in REFERENCE_NAMES:
        assert hasattr(compress_kernels.reference, name), name


def test_references_import_without_triton():
    code = ("import sys; sys.modules['triton'] = None\n"  # any import of triton now fails
            "import compress_kernels, compress_kernels.reference as ref\n"
            "assert not compress_kernels.TRITON_AVAILABLE and callable(ref.w8a8_matmul_ref)\n"
            "try:\n    compress_kernels.w8a8_matmul()\nexcept ImportError as err:\n    print(err)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "the kernels need Triton" in out
