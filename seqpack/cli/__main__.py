"""``python -m seqpack.cli``: the ``seqpack`` command."""

import sys

from seqpack.cli.main import main

sys.exit(main())
