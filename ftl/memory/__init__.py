"""ftl's memory across campaigns: failures and patterns with importance, decay, relationships and
feedback (FTL ``lib/memory.py``'s behaviour). `MemoryStore` holds the SQL (FTS5 bm25 for text
relevance); `scoring` holds the pure ranking rules. ``Store.memory_store()`` gives the store's.
"""

from ftl.memory.store import MEMORY_TYPES, MemoryStore

__all__ = ["MemoryStore", "MEMORY_TYPES"]
