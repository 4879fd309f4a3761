"""Storage tests use the moto S3 fixtures of tests/conftest.py."""
