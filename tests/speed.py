"""Engine options for the tests' runs: TokenSwift with some speed options (speed), or plain decoding (AR), whose
text every TokenSwift run must equal."""

from __future__ import annotations

from tokenswift.decode.options import EngineOptions
from tokenswift.settings import PLAIN, Speculation

AR = EngineOptions(speculation=PLAIN)


def speed(**changes) -> EngineOptions:
    """EngineOptions drafting with Speculation(**changes) (mode="ar": plain decoding)."""
    return EngineOptions(speculation=Speculation(**changes))
