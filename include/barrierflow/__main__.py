from barrierflow.cli import main

raise SystemExit(main())
