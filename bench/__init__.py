"""sandgate's benchmarks: ``bench/run foundation [--json] [--quick] [--only PART]``."""
