"""specchat: a terminal chat that makes speculative decoding visible, tunable and fast.

Importing the package loads neither torch nor textual; the CLI imports them lazily.
"""

__version__ = "0.1.0"
