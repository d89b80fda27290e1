"""Figures of the long-completion setting cpu_long (issue 37): the saving in seconds."""
