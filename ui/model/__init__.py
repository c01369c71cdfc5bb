"""The Model tab: the model the worker holds, the one it should hold next, and its drafters."""
