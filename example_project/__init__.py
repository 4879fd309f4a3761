"""example_project."""
