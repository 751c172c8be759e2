"""What the user names: packaged models (the catalog and their assembled chunks), folders,
files and hub ids."""
