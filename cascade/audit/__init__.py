"""The admin audit log: one append-only record per admin action, in the decision store."""
