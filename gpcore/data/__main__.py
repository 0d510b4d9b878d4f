"""``python -m gpcore.data inspect FILE`` (the same as ``python -m gpcore data inspect FILE``)."""

import sys

from gpcore.data.inspect import main

sys.exit(main())
