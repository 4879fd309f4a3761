"""noetl_dagster."""
