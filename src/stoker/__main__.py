"""``python -m stoker``: the same as the ``stoker`` command."""

import sys

from stoker.cli import main

sys.exit(main())
