"""Tenants: whose a bearer key is, the limits and policy it gets, and what it spends."""
