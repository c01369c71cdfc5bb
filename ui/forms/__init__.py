"""The settings form: its values as the engine's Settings with messages a writer reads (forms), and the boxes built
from the settings table (samplers_panel), shared by the Write tab, Compare's columns and the presets."""
