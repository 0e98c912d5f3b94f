"""Errors a user can fix: the CLI prints them as one line and exits with code 2."""


class UserError(Exception):
    """Bad input: the message says what was wrong and how to fix it."""


class RunFailed(Exception):
    """A run ended without finishing its budget; the message is the cause in summary.json."""
