"""MinCut: Scotch static mapping onto the GPUs only, the "MinCut" column of Mirhoseini et al. 2017 (Table 1).

Mirhoseini et al. (ICML 2017, Sec. 4.2) describe MinCut as the Scotch mapper run with only the GPUs as
target devices (the CPU left out). Everything else — weights, seeding, the target architecture, the
device-kind fix for ops that forbid GPUs (they go to the CPU) — is shared with `baselines.scotch`. On a
cluster without GPUs every device is a candidate.
"""

from __future__ import annotations

from baselines.scotch import Scotch


class MinCut(Scotch):
    """Scotch static mapping onto the GPUs only."""

    name = "mincut"
    include_cpu = False
