from ambient.cli import main

raise SystemExit(main())
