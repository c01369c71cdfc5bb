"""Benchmarks: AR versus TokenSwift, the bound, context shifting, GPU pass costs."""
