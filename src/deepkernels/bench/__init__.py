"""deepkernels.bench (see docs/DESIGN.md)."""
