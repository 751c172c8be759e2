"""The real terminal: a driver that survives the terminal going away, signals and crashes, and
toasts shown as plain text."""
