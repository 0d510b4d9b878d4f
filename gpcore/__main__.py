import sys

from gpcore.cli import main

sys.exit(main())
