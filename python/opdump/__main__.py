"""``python -m opdump``: see ``opdump._run``."""

import sys

from ._run import main

sys.exit(main())
