"""`python -m hetbench.worker`: the entry point every launcher starts once per rank."""

from hetbench.harness.worker import main

if __name__ == "__main__":
    main()
