"""@triton.jit helpers shared by several kernels."""
import triton
import triton.language as tl

__all__ = ["rne_bf16"]


@triton.jit
def rne_bf16(x):
    """fp32 -> nearest-even bf16 value, kept in fp32. Only used under the interpreter, whose fp32->bf16 cast
    truncates (the GPU cast rounds to nearest even), so interpreter results round like the GPU's."""
    u = x.to(tl.uint32, bitcast=True)
    u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
    return u.to(tl.float32, bitcast=True)
