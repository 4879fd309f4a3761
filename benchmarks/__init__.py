"""Benchmarks: ``python -m benchmarks`` runs every ``bench_*.py`` module's ``main()``
(``--only NAME`` runs one: ``engine`` or ``bench_engine``). Each prints its figures
next to a baseline measured in the same process, as a ratio, and a PASS/MISS per target."""
