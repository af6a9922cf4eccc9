"""Convolution family on a real GPU: what the interpreter cannot afford.

int64 indexing where the input spans past 2**31 elements (4 GiB of bfloat16), for the flat 1 x 1
kernel over either layout: its walk's pixel offsets times the channel stride pass 2**31.
"""

import pytest
import torch

import generated
from specgen import runtime

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("channels_last", [False, True])
def test_flat_kernel_int64_past_two_billion_elements(channels_last):
    # 16 channels x 32768 x 4097 pixels: 2**31 + 16 * 32768 elements
    x = torch.randn(1, 16, 32768, 4097, device="cuda", dtype=torch.bfloat16)
    if channels_last:
        x = x.to(memory_format=torch.channels_last)
    w = torch.randn(16, 16, 1, 1, device="cuda", dtype=torch.bfloat16) / 4
    with runtime.record_launches() as log:
        out = generated.conv2d(x, w)
    assert log[-1].kernel == "flat" and log[-1].index_bits == 64
    assert out.is_contiguous(memory_format=torch.channels_last) == channels_last
    # the last rows are the pixels an int32 offset would get wrong
    for rows in (slice(0, 2), slice(-2, None)):
        want = torch.einsum("kc,nchw->nkhw", w[:, :, 0, 0].double(), x[:, :, rows].double())
        torch.testing.assert_close(out[:, :, rows].double(), want, rtol=1.6e-2, atol=1e-2)
    del x, out
    torch.cuda.empty_cache()
