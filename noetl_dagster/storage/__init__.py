"""Storage adapters: event stores (SQLite, Postgres), payload stores, tables, archives."""
