"""How an estimate's unit is printed: fractions as percentage points or percent.

The statistics keep every accuracy and effect as a fraction (0.1304); an estimand's unit (its
registered `Estimand.unit`) says how a reading prints it:

- ``"pp"``: a difference of accuracies (or of other 0-1 fractions), printed as percentage
  points with one decimal and a sign: 0.1304 -> '+13.0 pp';
- ``"share"``: a ratio, printed as a whole percentage: 0.7049 -> '70%';
- anything else: the number with four significant digits and the unit after it.

Example:
    >>> from shortcutlab.stats.units import format_interval, format_value
    >>> format_value(0.1304, "pp"), format_value(0.7049, "share")
    ('+13.0 pp', '70%')
    >>> format_interval(0.091, 0.168, "pp")
    '95% CI +9.1 to +16.8 pp'
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

__all__ = ["ci_pct", "ci_pp", "format_interval", "format_value", "is_nan", "pct", "pct_shown", "pp", "pp_number", "pp_shown"]


def is_nan(x) -> bool:
    """True for None, a float NaN and pandas' NA: a number that is not there."""
    return x is None or (isinstance(x, (float, np.floating)) and math.isnan(x)) or x is pd.NA


def pp(x: float, signed: bool = True) -> str:
    """A fraction as percentage points with one decimal: 0.1304 -> '+13.0 pp'."""
    if is_nan(x):
        return "n/a"
    v = 100 * float(x)
    v = 0.0 if abs(v) < 0.05 else v  # no '-0.0'
    return f"{v:+.1f} pp" if signed else f"{v:.1f} pp"


def pp_number(x: float, signed: bool = True) -> str:
    """A fraction as percentage points without the unit: 0.1304 -> '+13.0' (no '-0.0')."""
    v = 100 * float(x)
    v = 0.0 if abs(v) < 0.05 else v
    return f"{v:+.1f}" if signed else f"{v:.1f}"


def pp_shown(x: float) -> float:
    """A fraction in percentage points as `pp_number` prints it (one decimal), as a number:
    0.1304 -> 13.0, -0.0004 -> 0.0; NaN stays NaN. Readings decide on these values, so two
    numbers that print alike always read alike."""
    return math.nan if is_nan(x) else float(pp_number(x))


def ci_pp(lo: float, hi: float, level: float = 0.95) -> str:
    """'95% CI +9.1 to +16.8 pp' (or 'no interval')."""
    if is_nan(lo) or is_nan(hi):
        return "no interval"
    return f"{level * 100:.0f}% CI {pp_number(lo)} to {pp_number(hi)} pp"


def pct(x: float) -> str:
    """A share as a whole percentage: 0.7049 -> '70%'."""
    if is_nan(x):
        return "n/a"
    v = 100 * float(x)
    return f"{0 if abs(v) < 0.5 else v:.0f}%"


def pct_shown(x: float) -> float:
    """A share in percent as `pct` prints it (a whole number), as a number: 0.4951 -> 50.0;
    NaN stays NaN."""
    return math.nan if is_nan(x) else float(pct(x).rstrip("%"))


def ci_pct(lo: float, hi: float) -> str:
    """'CI 45% to 95%' (or 'no interval')."""
    if is_nan(lo) or is_nan(hi):
        return "no interval"
    return f"CI {pct(lo)} to {pct(hi)}"


def format_value(x: float, unit: str) -> str:
    """An estimate in its unit: 'pp' -> `pp`, 'share' -> `pct`, else '0.1234 unit'."""
    if unit == "pp":
        return pp(x)
    if unit == "share":
        return pct(x)
    return "n/a" if is_nan(x) else f"{float(x):.4g} {unit}".rstrip()


def format_interval(lo: float, hi: float, unit: str, level: float = 0.95) -> str:
    """An interval in its unit: 'pp' -> `ci_pp`, 'share' -> `ci_pct`, else '95% CI a to b unit'."""
    if unit == "pp":
        return ci_pp(lo, hi, level)
    if unit == "share":
        return ci_pct(lo, hi)
    if is_nan(lo) or is_nan(hi):
        return "no interval"
    return f"{level * 100:.0f}% CI {float(lo):.4g} to {float(hi):.4g} {unit}".rstrip()
