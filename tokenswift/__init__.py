"""TokenSwift: lossless speculative decoding for ultra-long generation (design: ../shared/design/tokenswift.md).

The engine is a library of small modules and a CLI (`python -m tokenswift`); it imports nothing of the app.
"""

from tokenswift.settings import Settings, SettingsError

__all__ = ["Settings", "SettingsError"]
