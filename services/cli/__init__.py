"""The `pdserve` command line: one module per subcommand, wired together by `main`."""
