"""deepkernels.bench (see DESIGN.md)."""
