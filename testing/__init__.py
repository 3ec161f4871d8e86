"""What the tests and the benchmarks both use, and nothing else of the project does (the layout test
holds every other package to it): synthetic messages and small models (factories), a whole run started
and stopped from Python (harness: LaunchedRun, the episode audit, leftover processes), the sync-mode
audit (lockstep), hostile inputs (fuzz) and a real server run under them (fuzz_server)."""
