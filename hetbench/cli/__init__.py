"""`bench`, the command line: main.py (the group, list, run, summarize and main()), report.py
(report, compare, reproduce), sim.py (sim), flags.py (the matrix flags run and sim share)."""
