"""deepkernels.gemm (see DESIGN.md)."""
__all__: list[str] = []
