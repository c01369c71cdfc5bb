"""The Write tab: its components (write_parts), handlers (write, edit, presets, write_branch_events), what it shows
for a draft (write_view, wholetext, seen) and its World Info panel and branches."""
