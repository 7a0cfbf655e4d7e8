"""The error and the warning every diagnostic raises for bad or degenerate input."""

from __future__ import annotations

from shortcutlab.errors import ShortcutlabError


class DiagnosticError(ShortcutlabError):
    """A diagnostic got input it cannot use; the message names the diagnostic and the cause."""


class DiagnosticWarning(UserWarning):
    """A diagnostic's input is valid but degenerate (crops it cannot probe, features that carry
    nothing); the result records it too."""
