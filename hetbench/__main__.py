from hetbench.cli.main import main

main()
