from load.bench.cli import main

main()
