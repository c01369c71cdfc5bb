"""The Library tab: books and their drafts, opened, continued, renamed, deleted and exported."""
