"""Small integer helpers upstream exports (``deep_gemm.ceil_div``, ``deep_gemm.align``)."""


def ceil_div(x: int, y: int) -> int:
    return (x + y - 1) // y


def align(x: int, y: int) -> int:
    return ceil_div(x, y) * y
