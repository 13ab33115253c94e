"""The decision cache: tier answers keyed by everything that determines them."""
