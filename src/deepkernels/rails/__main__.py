"""``python -m deepkernels.rails plan ...`` (see :mod:`deepkernels.rails.cli`)."""
from .cli import main

raise SystemExit(main())
