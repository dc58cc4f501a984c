"""`python -m ember.runtime.fuzz`: run a fuzzing campaign (see campaign.py)."""

import sys

from ember.runtime.fuzz.campaign import main

sys.exit(main())
