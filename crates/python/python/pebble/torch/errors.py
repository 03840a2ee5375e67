"""The exceptions `pebble.torch` raises: one per cause, each naming it."""

from __future__ import annotations


class PebbleError(Exception):
    """Any error of `pebble.torch`."""


class UnsupportedModel(PebbleError):
    """The capture cannot handle this model: an op, a mutation, outputs that are not tensors."""


class BudgetTooSmall(PebbleError, ValueError):
    """No plan of this solver fits the budget; `least_budget` is the least that fits (or None)."""

    def __init__(self, message: str, budget: int, least_budget: int | None) -> None:
        super().__init__(message)
        self.budget = budget
        self.least_budget = least_budget


class PlanError(PebbleError):
    """The planner failed for a reason other than the budget (unknown solver, bad graph)."""
