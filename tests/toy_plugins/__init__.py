"""Toy plug-ins, one of each kind, each in one short module as a plug-in author would write it:
`toy_intervention` (an image intervention), `toy_diagnostic` (a diagnostic), `toy_estimand`
(an estimand) and `toy_executor` (a sweep executor). Each module's ``register()`` registers its
plug-in and ``unregister()`` removes it; ``tests/test_plugins_end_to_end.py`` runs all four
through a tiny sweep into the report.
"""
