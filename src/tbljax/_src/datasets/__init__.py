"""Opening and combining datasets: a file or shards as one dataset, a host's part, mixtures."""
