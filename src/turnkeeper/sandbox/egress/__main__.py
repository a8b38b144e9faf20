"""``python -m turnkeeper.sandbox.egress``: the egress proxy daemon (see ``daemon``)."""

import sys

from turnkeeper.sandbox.egress.daemon import main

sys.exit(main())
