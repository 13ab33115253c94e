"""Live control: the budget pacer, the threshold refit from labels, drift, and what feeds them."""
