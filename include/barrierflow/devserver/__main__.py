"""``python -m barrierflow.devserver`` (``make run``)."""

import sys

from barrierflow.devserver import main

sys.exit(main())
