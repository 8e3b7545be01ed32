"""The command line: kvconform's parser (main.py, which lists the verb
modules), what every verb shares (support.py), and a module per verb or verb
group, each with `register(subparsers)`."""
