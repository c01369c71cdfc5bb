"""The Plan tab: a book's premise, characters and chapters (plan_parts), wired (plan)."""
