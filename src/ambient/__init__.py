"""ambient: the ambient layer of an AI-agent brain.

It runs workflows of agents on its own and involves the person only when a decision is
truly theirs. Importing this package has no side effects.
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
