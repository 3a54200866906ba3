"""deepkernels.mla (see DESIGN.md)."""
__all__: list[str] = []
