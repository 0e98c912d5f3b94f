"""Running a matrix: matrix expansion, the runner (skip finished, set aside unfinished), the
launchers and the worker loop each rank runs."""
