"""`python -m speakerlab.train ...`: the same as `speakerlab-train ...`."""

import sys

from speakerlab.train.loop import main

sys.exit(main())
