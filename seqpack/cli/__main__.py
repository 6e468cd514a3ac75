"""``python -m seqpack.cli``: the ``seqpack`` command."""

import sys

from seqpack.cli.app import main

sys.exit(main())
