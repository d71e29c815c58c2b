from ftl.surfaces.cli import console

console()
