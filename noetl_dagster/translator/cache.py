"""The parsed-playbook cache lives in the dsl layer (``noetl_dagster.dsl.cache``) so that ``run``
can use it without importing the translator (Dagster); re-exported here for the code location."""

from noetl_dagster.dsl.cache import CACHE_ENV, cache_dir, cache_key, load_playbook_cached

__all__ = ["CACHE_ENV", "cache_dir", "cache_key", "load_playbook_cached"]
