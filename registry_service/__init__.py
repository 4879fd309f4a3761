"""registry_service."""
