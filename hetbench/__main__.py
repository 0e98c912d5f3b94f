from hetbench.cli import main

main()
