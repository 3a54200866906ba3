"""deepkernels.model (see DESIGN.md)."""
