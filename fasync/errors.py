"""The one exception a user's configuration raises when it cannot work."""


class ConfigurationError(Exception):
    """A config names something unusable (missing file, bad dataset line, reward that does not import).

    The message is one line, fit to print as is, and names the config key at fault.
    """
