"""What a fleet of gateways shares in Redis: answer counts, the lease, gates, histograms."""
