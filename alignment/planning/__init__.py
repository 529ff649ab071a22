"""Planning a process layout before any device is touched: the memory model of a training stage per rank and phase
(memory) and the search over tensor x pipeline x sharding x data layouts for one that fits (search)."""
