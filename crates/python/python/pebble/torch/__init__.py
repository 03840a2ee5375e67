"""pebble for PyTorch: plan and train your own `nn.Module` within a memory budget.

    import pebble.torch as pt
    planned = pt.wrap(model, (x,), activation_budget="50%", solver="checkmate")
    planned(x).sum().backward()      # gradients in model.parameters(), as eager
    planned.report                   # solver, budget_bytes, predicted_peak_bytes, ...
"""

from .capture import Captured, capture
from .errors import BudgetTooSmall, PebbleError, PlanError, UnsupportedModel
from .wrap import Planned, wrap

__all__ = ["wrap", "Planned", "capture", "Captured", "PebbleError", "BudgetTooSmall", "UnsupportedModel", "PlanError"]
