"""Foundation helpers that import nothing else from the project (the bottom layer)."""
