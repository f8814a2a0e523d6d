"""lenbench's Hydra sweeper (a plugin: Hydra instantiates plugins from this namespace only)."""
