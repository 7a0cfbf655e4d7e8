"""shortcutlab's `interventions` package.

Test-time image interventions (background removal, illumination flattening, colour and
stain transfer, ...). They arrive with the interventions issue; the package is installed now so
that the distribution's layout is fixed.
"""

__all__: list[str] = []
