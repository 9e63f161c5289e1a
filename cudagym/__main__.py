from cudagym.cli import main

raise SystemExit(main())
