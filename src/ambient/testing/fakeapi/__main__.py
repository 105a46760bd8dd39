"""``python -m ambient.testing.fakeapi``: serve one fake API until SIGTERM."""

from .playbook import main

raise SystemExit(main())
