"""What every stage shares: config checks, the results schema and its files, series identity,
statistics, shards, the device runtime and progress bars. Imports nothing of ``bench`` outside it.
"""
