"""ftl's memory across campaigns: failures and patterns with importance, decay, relationships and
feedback (FTL ``lib/memory.py``'s behaviour). `MemoryStore` holds the rules over the store's
memory tables (whose SQL, FTS5 bm25 for text relevance included, is `ftl.store.memory_tables`);
`scoring` holds the pure ranking formulas. Build one on a store: ``MemoryStore(store)``.
"""

from ftl.memory.store import MEMORY_TYPES, MemoryStore

__all__ = ["MemoryStore", "MEMORY_TYPES"]
