"""`python -m idempotency_layer`: the operator CLI (`cli.main`). The layer's runtime never imports this."""

import sys

from .cli import main

sys.exit(main())
