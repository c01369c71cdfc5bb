"""The drafts service and what every front door (the tabs, the REST API, the OpenAI-compatible endpoint) shares:
starting and steering drafts (drafts), alternatives and branches, prompt tokens against the context (tokens), draft
texts for pollers (texts), text and request limits, exports, and a book's plan as chapter drafts (plan_drafts,
plan_input)."""
