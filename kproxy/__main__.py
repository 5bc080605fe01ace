"""``python -m kproxy`` runs the ``kproxy`` command."""

from kproxy.cli.main import main

raise SystemExit(main())
