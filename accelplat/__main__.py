"""Run the ``accelplat`` command line as ``python -m accelplat``."""

from accelplat._cli import main

raise SystemExit(main())
