"""A task module whose pre-warmed runners die while importing it (a fresh process imports it fine)."""

import os
import sys

from gts_warm_tasks import WarmProbe

if "--warm" in sys.argv:  # a warm runner's argv (backends/local/prepare.py: runner_argv)
    os._exit(3)


class DiesWarm(WarmProbe):
    pass
