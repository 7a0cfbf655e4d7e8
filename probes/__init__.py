"""shortcutlab's `probes` package: diagnostics of what a trained model's features carry.

Every diagnostic follows one contract (`probes.base`): settings in ``__init__``, ``run(ctx)``
on a `DiagnosticContext` (one wrapped model, its crops and split), tidy rows out. Look them up
by name (`available`, `get`) as for interventions; plug-ins join through the entry-point group
``shortcutlab.diagnostics``.

Frozen features come from `extract_features` (batched, cached on disk by weights and crops).

Diagnostics: ``group_identifiability`` (`GroupIdentifiability`: can the parent of a held-out
sibling be named from its features, or from its cell-free background?).
Saliency (`probes.saliency`): `gradcam` maps, their `outside_mass` and the
`randomized_head_check`; the `gradcam` diagnostic reports them on the test side.
Parent recoverability R (a within-class, held-out-sibling logistic probe) is `ParentProbe`;
`LeaceErasure` erases the parent code (concept-erasure's LEACE, rank-limited, within class),
`refit_head` trains a head on erased features and `erasure_check` runs the paper's F5 check;
`LinearAdversary` / `adversary_check` are the probe-matched linear adversary (F7), and
`remeasure_R` re-probes a model trained with a gradient-reversal adversary (H5).
"""

from .adversary import AdversaryCheck, LinearAdversary, LinearAdversaryDiagnostic, adversary_check, remeasure_R
from .base import NEEDS, QUANTITIES, ROW_COLUMNS, Diagnostic, DiagnosticContext, row
from .errors import DiagnosticError, DiagnosticWarning
from .features import extract_features, weights_hash
from .identifiability import GroupIdentifiability, GroupIdentifiabilityDiagnostic, remove_cell
from .leace import ErasureCheck, HeadRefit, LeaceDiagnostic, LeaceErasure, erasure_check, refit_head
from .parent_probe import ParentProbe, ParentProbeDiagnostic, sibling_folds, wilson_interval
from .registry import ENTRY_POINT_GROUP, available, get, get_class, load_entry_points, register, suppliers, unregister
from .saliency import HeadCheck, gradcam, outside_mass, randomized_head_check

# Built-in diagnostics register themselves on import.
from .interventions_accuracy import InterventionAccuracy
from .diagnose import diagnose, intervention_targets, unseen_field_targets_for, write_diagnostics

__all__ = [
    "AdversaryCheck",
    "ErasureCheck",
    "HeadRefit",
    "LeaceDiagnostic",
    "LeaceErasure",
    "LinearAdversary",
    "LinearAdversaryDiagnostic",
    "ParentProbe",
    "ParentProbeDiagnostic",
    "adversary_check",
    "erasure_check",
    "refit_head",
    "remeasure_R",
    "sibling_folds",
    "wilson_interval",
    "ENTRY_POINT_GROUP",
    "NEEDS",
    "QUANTITIES",
    "ROW_COLUMNS",
    "Diagnostic",
    "InterventionAccuracy",
    "DiagnosticContext",
    "DiagnosticError",
    "DiagnosticWarning",
    "GroupIdentifiability",
    "GroupIdentifiabilityDiagnostic",
    "HeadCheck",
    "available",
    "diagnose",
    "extract_features",
    "get",
    "get_class",
    "gradcam",
    "intervention_targets",
    "load_entry_points",
    "outside_mass",
    "randomized_head_check",
    "register",
    "remove_cell",
    "row",
    "suppliers",
    "unregister",
    "unseen_field_targets_for",
    "weights_hash",
    "write_diagnostics",
]
