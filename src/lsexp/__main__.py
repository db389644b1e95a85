from lsexp.cli import main

main()
