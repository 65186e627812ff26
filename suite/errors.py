"""Errors raised on bad input. Each names the file, field and value that is wrong.

The CLI turns any `PlacebenchError` into a one-line message and a non-zero exit code.
"""

from __future__ import annotations


class PlacebenchError(Exception):
    """Base class for every user-facing error of placebench."""


class GraphError(PlacebenchError):
    """A malformed or invalid operation graph (cycle, bad number, unknown endpoint, ...)."""


class ClusterError(PlacebenchError):
    """A malformed or invalid cluster description."""


class PlacementError(PlacebenchError):
    """A placement that does not fit its workload and cluster."""


class ProfileError(PlacebenchError):
    """A malformed per-op profile table."""


class SpecError(PlacebenchError):
    """A malformed suite spec or methodology file."""


class UnknownNameError(PlacebenchError, KeyError):
    """An unknown workload, cluster, placer or spec name."""

    def __str__(self) -> str:  # KeyError quotes its message; we do not want that.
        return str(self.args[0]) if self.args else ""


class BudgetExhausted(PlacebenchError):
    """A placer asked the evaluator for more evaluations or time than its budget allows."""
