"""`eaglekit bench`: serving throughput with and without a draft, at concurrency, in the real engine."""
