"""``python -m barrierflow.devserver`` (``make run``)."""

import sys

from barrierflow.devserver.server import main

sys.exit(main())
