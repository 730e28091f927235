import sys

from kvmtune.cli import main

sys.exit(main())
