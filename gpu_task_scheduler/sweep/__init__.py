"""From a config to runs: config files, options, expansion, folder names, command templates."""
