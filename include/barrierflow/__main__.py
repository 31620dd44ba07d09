from barrierflow.tools.cli import main

raise SystemExit(main())
