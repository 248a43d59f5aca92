"""``python -m compress.cli``: the ``compress`` command (:func:`compress.cli.main`), for environments
without the console script (the GPU run scripts, the FSDP benchmark)."""
import sys

from compress.cli import main

sys.exit(main())
