"""attntune's tuning cache: SQLAlchemy store, pydantic row models, user-over-system layering."""

from attntune.cache.layered import LayerFailure, LayeredCache, system_cache_path, user_cache_url
from attntune.cache.models import CachedRow, WinnerRecord, judge, utcnow
from attntune.cache.store import CacheError, CacheStore, normalize_url

__all__ = ["LayeredCache", "LayerFailure", "CacheStore", "CacheError", "CachedRow", "WinnerRecord", "judge", "utcnow",
           "normalize_url", "user_cache_url", "system_cache_path"]
