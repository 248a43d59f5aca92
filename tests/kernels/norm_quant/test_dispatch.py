"""norm_quant's launch table (compress_kernels/norm_quant/dispatch.py): a row's power-of-two width and warps."""
from compress_kernels.norm_quant.dispatch import MAX_ROW, RowConfig, pick


def test_rows_are_padded_to_a_power_of_two_with_warps_by_width():
    assert pick(1) == RowConfig(1, 4)
    assert pick(384) == RowConfig(512, 4)
    assert pick(1536) == RowConfig(2048, 8)
    assert pick(4096) == RowConfig(4096, 8)
    assert pick(MAX_ROW) == RowConfig(MAX_ROW, 16)
