"""Statistics on tidy results: pure functions of numbers and frames, no file or model access.

The estimands follow the paper (reference 000, "Study design" and Table 2):

- **leak effect** (H3, F3): accuracy of the leak model minus the clean model of the same
  factorial cell on the common test crops of its seed (`leak_effect`);
- **leak cut** (F2, F4): the leak effect on unaltered crops minus the leak effect under an
  intervention, with the share of the leak removed and the intervention's accuracy cost on
  clean models (`intervention_effect`);
- **protocol effect** (H1, H2): accuracy of P1 (crop-level split) minus P2 (parent-disjoint)
  models (`protocol_effect`);
- **dose-response** (F5-F8): the OLS slope of a gap on parent recoverability R with a cluster
  bootstrap interval (`dose_response`).

Inference is the paper's primary one: a paired two-way cluster bootstrap over seeds and test
parents, percentile intervals, bootstrap p-values, Holm within named families (`holm`,
`add_holm`); `estimates` runs every registered estimand (`register_estimand`: a function with
its unit and reading) and assembles them into one tidy table.

Modules, one idea each: `predictions` (the predictions table's columns and checks),
`bootstrap` (the vectorised two-way cluster bootstrap and its intervals), `factorial` (the leak
effect), `effects` (interventions, protocol, diversity, the pooled H3 rows), `dose`
(dose-response), `multiple` (Holm), `hypotheses` (the paper's labels H1-F8 and their registered
families), `sensitivity` (sign-flip, per-seed t, binomial mixed model), `power` (variance
components and simulated power),
`intervals` (Wilson, chance level, parent-cluster bootstrap of one accuracy; Newcombe's interval
and the parent-cluster bootstrap of a difference of two), `simulate`
(predictions with a known effect), `units` (how a unit is printed) and `estimands` (the
registry and `estimates`).

Units: accuracies and effects are fractions (0.0173, not 1.73 pp).
"""

from .bootstrap import bootstrap_summary
from .dose import DOSE_COLUMNS, dose_points, dose_response
from .effects import INTERVENTION_COLUMNS, PROTOCOL_COLUMNS, intervention_effect, protocol_effect
from .errors import StatsError, StatsWarning
from .estimands import (ESTIMATE_COLUMNS, Estimand, EstimandContext, available_estimands, estimand_units, estimates,
                        get_estimand, read_row, register_estimand, unregister_estimand)
from .factorial import LEAK_COLUMNS, factorial_rows, leak_effect
from .intervals import (against_chance, chance_level, cluster_bootstrap_difference, cluster_bootstrap_interval, newcombe_interval,
                        wilson_interval)
from .multiple import add_holm, holm
from .predictions import EXPOSURES, PREDICTION_COLUMNS, check_predictions, correct_as_float
from .simulate import simulate_factorial, true_leak_effect

__all__ = [
    "DOSE_COLUMNS",
    "ESTIMATE_COLUMNS",
    "EXPOSURES",
    "INTERVENTION_COLUMNS",
    "LEAK_COLUMNS",
    "PREDICTION_COLUMNS",
    "PROTOCOL_COLUMNS",
    "StatsError",
    "StatsWarning",
    "add_holm",
    "against_chance",
    "check_predictions",
    "correct_as_float",
    "factorial_rows",
    "bootstrap_summary",
    "chance_level",
    "cluster_bootstrap_difference",
    "cluster_bootstrap_interval",
    "dose_points",
    "dose_response",
    "estimates",
    "holm",
    "intervention_effect",
    "leak_effect",
    "newcombe_interval",
    "protocol_effect",
    "simulate_factorial",
    "true_leak_effect",
    "wilson_interval",
    # the estimand registry
    "Estimand",
    "EstimandContext",
    "available_estimands",
    "estimand_units",
    "get_estimand",
    "read_row",
    "register_estimand",
    "unregister_estimand",
]
