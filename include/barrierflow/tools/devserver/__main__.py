"""``python -m barrierflow.tools.devserver`` (``make run``)."""

from barrierflow.tools.devserver.server import main

raise SystemExit(main())
