"""The writer's text: prompting, the context window, World Info, detokenization, writing presets."""
