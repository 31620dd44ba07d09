"""``python -m barrierflow.tools.devserver`` (``make run``)."""

import sys

from barrierflow.tools.devserver.server import main

sys.exit(main())
