"""Files at URLs: names, globs, retrying reads, staging shards to local disk."""
