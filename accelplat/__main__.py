"""Run the ``accelplat`` command line as ``python -m accelplat``."""

from accelplat.cli import main

raise SystemExit(main())
