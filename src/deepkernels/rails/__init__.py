"""deepkernels.rails (see DESIGN.md)."""
