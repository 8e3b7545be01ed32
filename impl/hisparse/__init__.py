"""HiSparse: a layer's KV history kept in host memory, with only some of its
pages on the GPU (specs/KV_CACHE_MANAGER.md §14).

- specs.py: the resident and hot group specs;
- host_pool.py: the host tier's block pool (its own blocks, events as "CPU");
- types.py: what the coordinator hands the worker (transfers, row mirrors,
  residency updates);
- coordinator.py: which pages are on the GPU, their write-backs and restores,
  and when host pages become findable by prefix lookups.

The three managers (source, resident, hot) are impl/managers/hisparse.py.
"""
