"""deepkernels.reference (see DESIGN.md)."""
