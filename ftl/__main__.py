from ftl.cli import main

main()
