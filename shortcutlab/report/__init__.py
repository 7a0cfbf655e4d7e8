"""`shortcutlab report DIR`: one self-contained HTML file and a Markdown twin over a sweep.

Modules, one idea each:

- `folder`: `SweepFolder`, the only code that knows the sweep folder's layout;
- `tables`: the numbers behind the figures (per-model accuracy, leak/clean pairs, R and the
  gap, Grad-CAM rows, the validity table, the audit card), pure functions of the tables;
- `readings`: the sentences generated from the numbers, with the rules in its docstring;
- `figures`: one `Section` per figure (matplotlib, Agg), or why it is left out;
- `render`: HTML (inline CSS, figures as data: URIs) and Markdown;
- `build`: `build_report`, which writes the set atomically.

Example:
    >>> from shortcutlab.report import build_report        # doctest: +SKIP
    >>> build_report("sweep-minimal")["html"]               # doctest: +SKIP
    '.../sweep-minimal/report/report.html'
"""

from shortcutlab.report.build import build_report, validity_display
from shortcutlab.report.folder import ModelRef, ReportError, SweepFolder
from shortcutlab.report.readings import leak_reading, removal_verdict
from shortcutlab.report.tables import validity_table

__all__ = ["ModelRef", "ReportError", "SweepFolder", "build_report", "leak_reading", "removal_verdict", "validity_display",
           "validity_table"]
