"""Shadow calls: cheap-final requests mirrored to the strong tier in the background."""
