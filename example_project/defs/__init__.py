"""The example project's defs folder: one NoETL playbooks component (defs/playbooks/defs.yaml)."""
