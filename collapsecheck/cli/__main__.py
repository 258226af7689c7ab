from collapsecheck.cli import main

main()
