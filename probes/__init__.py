"""shortcutlab's `probes` package.

Probes, erasure, adversaries and saliency diagnostics over a wrapped model's features. They
arrive with the probes issue; the package is installed now so that the distribution's layout
is fixed.
"""

__all__: list[str] = []
