"""deepkernels.compat (see DESIGN.md)."""
