"""deepkernels.quant (see DESIGN.md)."""
__all__: list[str] = []
