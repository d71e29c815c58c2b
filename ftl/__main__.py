from ftl.surfaces.cli import main

main()
